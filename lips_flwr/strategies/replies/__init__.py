"""The reply gate both Flower APIs share (:mod:`.gate`).

- :mod:`.checks`: what makes one reply unusable (no flwr import);
- :mod:`.headers`: the global model's ``.npy`` headers and the fast paths they allow;
- :mod:`.dtypes`: the dtype a round is aggregated in, and the cast to it;
- :mod:`.gate`: admission of the replies;
- :mod:`.retry`: the checked aggregation, and its retry without the culprits;
- :mod:`.message_access`, :mod:`.legacy_access`: what the
  gate needs of each API's replies.
"""

from .gate import ReplyAccess, ReplyGate
from .retry import Aggregated

__all__ = ["Aggregated", "ReplyAccess", "ReplyGate"]
