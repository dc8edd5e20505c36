"""Shared helpers of the benchmark scripts: model shapes, paired timing, peak memory.

Not part of the package and not run by CI. Every script measures the variants
it compares side by side in one process, interleaved round-robin (the order
rotates every repetition), so that a noisy shared machine slows all of them
alike; it reports medians and the median of the per-repetition ratios.
"""

from __future__ import annotations

import os
import gc
import logging
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent

MB = 1024 * 1024


# ----- models -----

def torch_model(name: str):
    """``"resnet8"``: the paper's ResNet8 (1.26M); ``"resnet18"``: torchvision's (11.2M)."""
    if name == "resnet8":
        from lips_flwr.experiments.task.models import ResNet8

        return ResNet8(num_classes=100)
    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18(num_classes=100)
    raise ValueError(name)


def model_spec(name: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``name -> (shape, dtype)`` of the model's state_dict, in order."""
    state = torch_model(name).state_dict()
    return {k: (tuple(v.shape), v.numpy().dtype) for k, v in state.items()}


def make_model(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """A state_dict of plain numpy arrays with the model's names, shapes and dtypes."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, (shape, dtype) in model_spec(name).items():
        if np.issubdtype(dtype, np.floating):
            out[key] = rng.standard_normal(shape, dtype=np.float32).astype(dtype) * 0.05
        else:
            out[key] = np.full(shape, 10, dtype=dtype)
    return out


def client_models(base: dict[str, np.ndarray], num: int, seed: int = 1, distinct: int = 8):
    """``num`` trained models: ``base`` plus one of ``distinct`` random updates, scaled
    per client, so every client's arrays are distinct objects with distinct values."""
    rng = np.random.default_rng(seed)
    deltas = [
        {k: rng.standard_normal(v.shape, dtype=np.float32) * 0.01 for k, v in base.items()
         if np.issubdtype(v.dtype, np.floating)}
        for _ in range(distinct)
    ]
    for i in range(num):
        delta, scale = deltas[i % distinct], np.float32(1.0 + 0.01 * i)
        yield {k: (v + delta[k] * scale).astype(v.dtype) if k in delta else v.copy()
               for k, v in base.items()}


def num_params(model: dict[str, np.ndarray]) -> int:
    return int(sum(a.size for a in model.values()))


def nbytes(model: dict[str, np.ndarray]) -> int:
    return int(sum(a.nbytes for a in model.values()))


# ----- timing -----

def rotated(items: list, rep: int) -> list:
    """``items`` in the order repetition ``rep`` runs them: the start turns one place a repetition, so
    that no variant always runs first (or right after the same other one)."""
    turn = rep % len(items)
    return items[turn:] + items[:turn]


def paired_times(
    variants: dict[str, Callable[[], object]], reps: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per call of each variant, run round-robin with a rotating order."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for name in rotated(names, rep):
            gc.collect()
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median of the per-repetition ratios ``num[i] / den[i]``."""
    return statistics.median(a / b for a, b in zip(num, den))


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes allocated while ``fn`` runs, above what was allocated before.

    tracemalloc sees Python objects (``bytes`` of serialized arrays) and numpy
    array buffers (numpy reports them to tracemalloc). The result of ``fn`` is
    held until the peak is read, so it counts.
    """
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
        del result
    finally:
        tracemalloc.stop()
    return peak - base


# ----- output -----

def quiet_flower() -> None:
    """Flower logs a line per aggregation; keep the tables readable."""
    logging.getLogger("flwr").setLevel(logging.WARNING)


def machine_line() -> str:
    cpus = os.cpu_count()
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = cpus
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f" {int(f.readline().split()[1]) / MB:.0f} GiB RAM,"
    except OSError:
        pass
    import flwr  # noqa: PLC0415

    return (f"{platform.processor() or platform.machine()}, {affinity} of {cpus} CPUs,{mem} "
            f"Python {platform.python_version()}, numpy {np.__version__}, flwr {flwr.__version__}; "
            f"{load_line()}")


def load_line() -> str:
    """The 1-minute load average: other processes on a shared machine skew every figure."""
    return f"load average {os.getloadavg()[0]:.1f}"


def process_wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one process run to its end in the repository (``RuntimeError`` with the end of
    its output if it failed); ``env``: added to this process's environment."""
    import subprocess  # noqa: PLC0415

    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False,
                          env=None if env is None else {**os.environ, **env})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall


def code_line() -> str:
    """Which lips_flwr code was measured: the commit, and files changed since."""
    import subprocess  # noqa: PLC0415

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return proc.stdout.rstrip()

    dirty = git("status", "--porcelain", "--", "lips_flwr").splitlines()
    changed = ", ".join(line[3:] for line in dirty)
    return f"lips_flwr at {git('rev-parse', '--short', 'HEAD').strip() or '?'}" + (
        f" + uncommitted changes to {changed}" if changed else "")


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *map(line, rows)])
