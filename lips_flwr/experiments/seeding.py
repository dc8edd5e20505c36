"""Seeds for the process-wide random generators, and a way to keep a caller's draws its own.

An app that never seeds still draws from Python's :mod:`random`, numpy's
global generator (``np.random.*``) and torch's default generators (CPU, and
each CUDA device). The batched Grid runs a ServerApp and every ClientApp call
in one process, so these four streams are shared: without care, what one
client draws depends on every call before it, and the ServerApp's draws
(e.g. FedAvg's node sampling) on what the clients drew. These helpers let the
Grid give every call its own seeded streams and keep the ServerApp's.

Generators an app creates itself (``np.random.default_rng()``,
``torch.Generator()``, ``random.Random()``) are not touched.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

SEED_LIMIT = 2**32  # numpy's global generator takes seeds in [0, 2**32)


def derive_seed(*parts: int) -> int:
    """A seed in ``[0, 2**32)`` for the sequence ``parts``: ``SeedSequence(parts).generate_state(1)``.

    Different sequences give independent-looking seeds (numpy's
    ``SeedSequence`` hashing), so ``derive_seed(seed, 1 + partition_id,
    round, kind)`` gives every node, round and kind of call its own stream.
    Raises ``ValueError`` unless every part is a non-negative ``int`` (not a
    ``bool``), and there is at least one.
    """
    if not parts:
        raise ValueError("derive_seed needs at least one part")
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, int) or part < 0:
            raise ValueError(f"seed parts must be non-negative ints, got {part!r} in {parts!r}")
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


def seed_globals(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator and torch's default generators with ``seed``.

    Torch's: ``torch.manual_seed`` (the CPU generator and every CUDA device's,
    the latter when CUDA is initialised, or when it is, if it is not yet),
    as :func:`seed_torch` makes it.
    Raises ``ValueError`` unless ``0 <= seed < 2**32`` (numpy's limit).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"a seed must be an int in [0, 2**32), got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    seed_torch(seed)


def seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)``, leaving out the device backends that are not available here.

    ``torch.manual_seed`` seeds the CPU's generator and each backend's (CUDA,
    MPS, XPU, MTIA, a custom one); a backend not yet initialised gets the
    seed queued, with a formatted stack trace (~30 us each). One that is not
    available never initialises, so its queued seed never takes effect:
    skipping it changes no draw, and saves ~0.1 ms of every seeded client
    call on a machine with neither XPU nor MTIA (any CPU or CUDA machine).
    With a custom (privateuse1) backend registered, this is ``torch.manual_seed`` itself.
    """
    seed = int(seed)  # (as torch.manual_seed: a numpy integer too)
    if hasattr(torch, torch._C._get_privateuse1_backend_name()):
        torch.manual_seed(seed)
        return
    for in_bad_fork, seed_all in _seeded_backends():  # (as torch.manual_seed: not in a child forked
        if not in_bad_fork():                          # after the backend started)
            seed_all(seed)
    torch.default_generator.manual_seed(seed)


# The backends torch.manual_seed seeds (torch.random._manual_seed_impl), with their seeding function.
SEEDED_BACKENDS = (("cuda", "manual_seed_all"), ("mps", "manual_seed"), ("xpu", "manual_seed_all"),
                   ("mtia", "manual_seed_all"))


@functools.cache
def _seeded_backends() -> list[tuple[Callable[[], bool], Callable[[int], None]]]:
    """``(_is_in_bad_fork, its manual seed)`` of each available backend that ``torch.manual_seed`` seeds."""
    backends = []
    for name, seed_name in SEEDED_BACKENDS:
        module = getattr(torch, name, None)
        if module is None:
            continue
        if _cuda_present() if name == "cuda" else module.is_available():
            backends.append((module._is_in_bad_fork, getattr(module, seed_name)))
    return backends


@functools.cache
def _cuda_present() -> bool:
    """Whether this process can use a CUDA device: ``torch.cuda.device_count() > 0``, which asks NVML
    where it can (``torch.cuda.is_available()`` may start CUDA's driver instead, and then a forked
    child cannot use CUDA)."""
    return torch.cuda.device_count() > 0


@dataclass(frozen=True)
class GlobalsState:
    """The states of the process-wide generators at one moment (see :func:`saved_globals`)."""

    python: Any
    numpy: Any
    torch_cpu: torch.Tensor
    torch_seed: int  # the CPU generator's seed, which a not-yet-initialised CUDA would be seeded with
    cuda: list[torch.Tensor] | None  # every device's state; None when CUDA was not initialised


def saved_globals() -> GlobalsState:
    """The current states of ``random``, numpy's global generator and torch's CPU and CUDA generators."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return GlobalsState(random.getstate(), _numpy_state(), torch.get_rng_state(), torch.initial_seed(), cuda)


def _numpy_state() -> Any:
    """``np.random.get_state()``, an MT19937 key as a list of ints: ``set_state`` copies a list's 624 words
    ~20x faster than an array's (~1 against ~25 us: the stacked engine puts a client's back at each turn).
    Another bit generator (``np.random.set_bit_generator``) gives its dict, kept as it is."""
    state = np.random.get_state(legacy=False)
    if state.get("bit_generator") != "MT19937":
        return state
    key = cast(np.ndarray, state["state"]["key"])
    return ("MT19937", key.tolist(), state["state"]["pos"], state["has_gauss"], state["gauss"])


def restore_globals(state: GlobalsState) -> None:
    """Put the process-wide generators back into ``state``.

    CUDA's generators get their saved states; if CUDA was not initialised
    when ``state`` was saved, they are seeded (now, or once CUDA initialises)
    with the CPU generator's seed of that moment, as a ``torch.manual_seed``
    then would have left them. Where no CUDA device is available (it never
    initialises) that is skipped: torch queues such a seed with a formatted
    stack trace, ~30 us of every client call on the stacked engine.
    """
    random.setstate(state.python)
    np.random.set_state(state.numpy)
    torch.set_rng_state(state.torch_cpu)
    if state.cuda is not None:
        torch.cuda.set_rng_state_all(state.cuda)
    elif _cuda_present():
        torch.cuda.manual_seed_all(state.torch_seed)


@contextmanager
def globals_kept() -> Iterator[None]:
    """Within the block, draw from the process-wide generators freely; on exit they are as on entry.

    Saves the states of ``random``, numpy's global generator and torch's CPU
    (and, when initialised, CUDA) generators on entry and restores them on
    exit, however the block ends (see :func:`restore_globals`).
    """
    state = saved_globals()
    try:
        yield
    finally:
        restore_globals(state)


__all__ = ["GlobalsState", "derive_seed", "globals_kept", "restore_globals", "saved_globals", "seed_globals",
           "seed_torch"]
