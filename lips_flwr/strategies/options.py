"""The keyword arguments every LIPS strategy takes, and the options forced on strategies built in a block.

``lips-flwr compare`` runs a user's app unchanged with LIPS off: every LIPS
strategy the app builds gets ``tau0=0``, which reproduces the wrapped
strategy bit for bit (client mods then mask nothing either)::

    with forced_options(tau0=0.0):
        server_app(grid, context)    # LIPS(FedAvg(...)) inside is FedAvg

The forced values replace what the app passes, at construction, and each
strategy logs them once. A :class:`~contextvars.ContextVar` holds them, so a
block covers the thread (or task) it runs in, and nothing else. The block
yields a :class:`Forcing` that counts the LIPS strategies built under it: an
app that builds none runs as written, which compare must not take for its
LIPS-off arm.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from logging import INFO
from types import MappingProxyType
from typing import Any, TypedDict

from flwr.common import log

from ..core.layers import LayerSpec
from ..core.lips import OPTIONS, TRIGGER_OPTIONS

CHECKPOINT_OPTIONS = ("checkpoint_path", "resume", "skip_undeclared_state")
CORE_OPTIONS = (*OPTIONS, *TRIGGER_OPTIONS)  # what LIPSCore takes
ALL_OPTIONS = (*CORE_OPTIONS, *CHECKPOINT_OPTIONS)


class LIPSOptions(TypedDict, total=False):
    """The keyword arguments every LIPS strategy takes, written once: the README's Options table is
    their one description, :class:`~lips_flwr.core.lips.LIPSCore` validates them."""

    num_rounds: int | None
    tau0: float
    every: int
    start_round: int
    decay: str
    score: str
    layers: LayerSpec
    mode: str
    seed: int
    inertia_t0: int | None
    mask_last_round: bool
    trigger: str
    trigger_window: int
    trigger_factor: float
    checkpoint_path: str | os.PathLike[str] | None
    resume: bool | str
    skip_undeclared_state: bool


def split_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the LIPS options out of ``kwargs`` (the FedAvg subclasses pass the rest to FedAvg)."""
    return {k: kwargs.pop(k) for k in ALL_OPTIONS if k in kwargs}


def lips_options(owner: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the forced values in place of the app's (logged when there are any);
    ``TypeError`` for a name that is not a LIPS option (``owner``: the strategy's class name)."""
    blocks = _FORCED.get()
    forced = {key: value for block in blocks for key, value in block.options.items()}  # inner blocks win
    if forced:
        log(INFO, "LIPS: %s built with forced options %s (the app's: %s)", owner, dict(forced),
            {k: options[k] for k in forced if k in options})
    options = {**options, **forced}
    unknown = sorted(set(options) - set(ALL_OPTIONS))
    if unknown:
        raise TypeError(f"{owner}() got unexpected keyword arguments {unknown}; "
                        f"the LIPS options are {list(ALL_OPTIONS)}")
    for block in blocks:
        block.strategies_built += 1
    return options


@dataclass
class Forcing:
    """A :func:`forced_options` block: the values it forces and how many LIPS strategies were built in it."""

    options: Mapping[str, Any]
    strategies_built: int = 0


_FORCED: ContextVar[tuple[Forcing, ...]] = ContextVar("lips_forced_options", default=())


@contextmanager
def forced_options(**options: Any) -> Iterator[Forcing]:
    """Force ``options`` (LIPS keyword arguments, e.g. ``tau0=0.0``) on every LIPS strategy built inside.

    Yields the block's :class:`Forcing` (``strategies_built`` counts the
    strategies that took the values, those of nested blocks included).
    Raises ``TypeError`` for a name that is not a LIPS option; the values are
    validated by each strategy, as if the app had passed them.
    """
    unknown = sorted(set(options) - set(ALL_OPTIONS))
    if unknown:
        raise TypeError(f"forced_options() got {unknown}, which are not LIPS options")
    forcing = Forcing(MappingProxyType(dict(options)))
    token = _FORCED.set((*_FORCED.get(), forcing))
    try:
        yield forcing
    finally:
        _FORCED.reset(token)


__all__ = ["ALL_OPTIONS", "CHECKPOINT_OPTIONS", "CORE_OPTIONS", "Forcing", "LIPSOptions", "forced_options",
           "lips_options", "split_options"]
