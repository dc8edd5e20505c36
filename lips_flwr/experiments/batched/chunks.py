"""The Rendezvous's gathered calls (:class:`GatheredCall`), and a chunk of them run.

:func:`run_together` runs calls of one group (the same work and model
signature, :meth:`.rendezvous.Rendezvous._groups`) at once, their models
stacked (:mod:`.stacked`); :func:`run_one_by_one` runs each as the
sequential engine would (a chunk of one, or a stacked chunk that failed, so
that one client's error stays that client's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lips_flwr.experiments.batched.signature import Entry, model_signature
from lips_flwr.experiments.seeding import GlobalsState, restore_globals, saved_globals
from lips_flwr.experiments.task.training import evaluate_tensors, train_tensors


@dataclass(eq=False)
class GatheredCall:
    """One client's pending call of ``train`` or ``evaluate``."""

    kind: str
    net: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    kwargs: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    error: BaseException | None = None
    index: int = 0  # the client's place in the round (its thread's), the order calls run in
    generators: GlobalsState | None = None  # the client's process-wide generators (``keep_generators``)

    def work(self) -> tuple:
        """What must be equal for calls to be stacked, besides their models: kind, data, settings."""
        settings = tuple(sorted((k, _hashable(v)) for k, v in self.kwargs.items() if k != "seed"))
        return (self.kind, tuple(self.x.shape), self.x.dtype, tuple(self.y.shape), self.y.dtype,
                self.x.device, settings)

    def signature(self) -> list[Entry]:
        """The model's signature in the mode its loop puts it in first (``train_tensors``: ``train()``)."""
        self.net.train(self.kind == "train")
        return model_signature(self.net)


def _hashable(value: Any) -> Any:
    return tuple(sorted(value)) if isinstance(value, (set, frozenset)) else value


def run_together(chunk: list[GatheredCall], autocast: torch.dtype | None = None) -> None:
    """Run a chunk's calls at once, their models stacked (:mod:`.stacked`); a chunk of one as
    :func:`run_one_by_one`. Each call gets its result; an error raises (the caller falls back)."""
    if len(chunk) == 1:
        run_one_by_one(chunk)
        return
    from lips_flwr.experiments.batched.stacked import evaluate_stacked, train_stacked

    nets, data = [c.net for c in chunk], [(c.x, c.y) for c in chunk]
    # models_checked: a chunk is of one group (Rendezvous._groups), whose models have one signature
    if chunk[0].kind == "train":
        settings = {k: v for k, v in chunk[0].kwargs.items() if k != "seed"}
        seeds = [int(c.kwargs.get("seed", 0)) for c in chunk]
        results: list[Any] = list(train_stacked(nets, data, seeds=seeds, autocast=autocast,
                                                models_checked=True, **settings))
    else:
        results = list(evaluate_stacked(nets, data, autocast=autocast, models_checked=True))
    for call, result in zip(chunk, results):
        call.result = result


def run_one_by_one(chunk: list[GatheredCall]) -> None:
    """Run each call of ``chunk`` alone, as the sequential engine would; an error is its call's."""
    from lips_flwr.experiments.batched.stacked import _seeded_global_rng

    for call in chunk:
        try:
            if call.generators is not None:  # the client's own generators, as if it ran the call itself
                restore_globals(call.generators)
                try:
                    call.result = run_alone(call)
                finally:
                    call.generators = saved_globals()
            elif call.kind == "train":
                # The global RNG (dropout) seeded with the call's seed, as the client seeded it before
                # its call: the clients' threads seeded it in turn while they arrived, so it holds
                # whichever came last.
                with _seeded_global_rng(int(call.kwargs.get("seed", 0)), call.x.device):
                    call.result = run_alone(call)
            else:
                call.result = run_alone(call)
        except Exception as err:  # noqa: BLE001 - raised in the client's own thread
            call.error = err


def run_alone(call: GatheredCall) -> Any:
    """What the sequential engine runs for ``call``."""
    if call.kind == "train":
        return train_tensors(call.net, call.x, call.y, **call.kwargs)
    return evaluate_tensors(call.net, call.x, call.y)


__all__ = ["GatheredCall", "run_alone", "run_one_by_one", "run_together"]
