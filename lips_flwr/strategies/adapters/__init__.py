"""The LIPS strategies of both Flower APIs: the round's sequence (:mod:`.base`), the Message API
(:mod:`.message`, :mod:`.message_loop`) and the legacy API (:mod:`.legacy`), explicit delegation
to the wrapped strategy (:mod:`.delegation`) and the sync of its cached models (:mod:`.cache_sync`)."""

from .legacy import LegacyLIPS, LegacyLIPSFedAvg
from .message import LIPS, LIPSFedAvg

__all__ = ["LIPS", "LIPSFedAvg", "LegacyLIPS", "LegacyLIPSFedAvg"]
