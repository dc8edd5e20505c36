"""LIPS options forced on every LIPS strategy built inside a block.

``lips-flwr compare`` runs a user's app unchanged with LIPS off: every LIPS
strategy the app builds gets ``tau0=0``, which reproduces the wrapped
strategy bit for bit (client mods then mask nothing either)::

    with forced_options(tau0=0.0):
        server_app(grid, context)    # LIPS(FedAvg(...)) inside is FedAvg

The forced values replace what the app passes, at construction, and each
strategy logs them once. A :class:`~contextvars.ContextVar` holds them, so a
block covers the thread (or task) it runs in, and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from logging import INFO
from types import MappingProxyType
from typing import Any

from flwr.common import log

_FORCED: ContextVar[Mapping[str, Any]] = ContextVar("lips_forced_options", default=MappingProxyType({}))


@contextmanager
def forced_options(**options: Any) -> Iterator[None]:
    """Force ``options`` (LIPS keyword arguments, e.g. ``tau0=0.0``) on every LIPS strategy built inside.

    Raises ``TypeError`` for a name that is not a LIPS option; the values are
    validated by each strategy, as if the app had passed them.
    """
    from ._adapter import CHECKPOINT_OPTIONS, CORE_OPTIONS  # (the adapter imports this module)

    unknown = sorted(set(options) - {*CORE_OPTIONS, *CHECKPOINT_OPTIONS})
    if unknown:
        raise TypeError(f"forced_options() got {unknown}, which are not LIPS options")
    token = _FORCED.set(MappingProxyType({**_FORCED.get(), **options}))
    try:
        yield
    finally:
        _FORCED.reset(token)


def with_forced(owner: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the forced values in place of the app's (logged when there are any)."""
    forced = _FORCED.get()
    if not forced:
        return dict(options)
    log(INFO, "LIPS: %s built with forced options %s (the app's: %s)", owner, dict(forced),
        {k: options[k] for k in forced if k in options})
    return {**options, **forced}


__all__ = ["forced_options"]
