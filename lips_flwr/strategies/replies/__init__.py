"""The reply gate both Flower APIs share: admission (:mod:`.gate`) with the per-reply checks
(:mod:`.checks`, :mod:`.headers`, :mod:`.dtypes`), the checked aggregation and its retry
(:mod:`.retry`), and what the gate needs of each API's replies (:mod:`.message_access`,
:mod:`.legacy_access`)."""

from .gate import ReplyAccess, ReplyGate
from .retry import Aggregated

__all__ = ["Aggregated", "ReplyAccess", "ReplyGate"]
