"""Stacked (vmap) against sequential local training and evaluation of many clients, on the CPU.

Each workload is run both ways on fresh copies of the same nets, the two
interleaved round-robin (the order alternates every repetition):

- ``sequential``: :func:`~lips_flwr.experiments.task.training.train_tensors` (or
  ``evaluate_tensors``) client after client;
- ``stacked``: :func:`~lips_flwr.experiments.batched.stacked.train_stacked`
  (or ``evaluate_stacked``) on all the clients at once.

Workloads (``--quick``: fewer clients and samples):

- FashionCNN training, 20 clients x 100 samples (1x28x28), 5 epochs, batch 50,
  lr 0.05, momentum 0.9;
- FashionCNN evaluation, 20 clients x 400 samples;
- ResNet8 training (100 classes), 10 clients x 100 samples (3x32x32), 1 epoch,
  batch 100.

Each with ``torch.set_num_threads(1)`` and then 2. Printed: the median
seconds of each, the median of the paired ratios stacked/sequential, and the
largest difference between the two ways' losses (float32 training drifts
apart a little: the point is that it is small)::

    python benchmarks/bench_stacked.py            # ~3-5 minutes on 2 cores
    python benchmarks/bench_stacked.py --quick    # ~20 s
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo

from lips_flwr.experiments.task.models import FashionCNN, ResNet8  # noqa: E402
from lips_flwr.experiments.batched.stacked import evaluate_stacked, train_stacked  # noqa: E402
from lips_flwr.experiments.task.training import evaluate_tensors, train_tensors  # noqa: E402

Data = list[tuple[torch.Tensor, torch.Tensor]]


def clients(factory: Callable[[], nn.Module], num: int, n: int, shape: tuple[int, ...],
            classes: int) -> tuple[list[nn.Module], Data]:
    """``num`` differently initialised nets and ``n`` random samples for each."""
    torch.manual_seed(0)
    nets = [factory() for _ in range(num)]
    data = [(torch.randn(n, *shape), torch.randint(0, classes, (n,))) for _ in range(num)]
    return nets, data


def train_variants(nets: list[nn.Module], data: Data, **kwargs) -> dict[str, Callable[[], list[float]]]:
    seeds = list(range(len(nets)))

    def sequential() -> list[float]:
        copies = [copy.deepcopy(net) for net in nets]
        return [train_tensors(net, x, y, seed=s, **kwargs) for net, (x, y), s in zip(copies, data, seeds)]

    def stacked() -> list[float]:
        return train_stacked([copy.deepcopy(net) for net in nets], data, seeds=seeds, **kwargs)

    return {"sequential": sequential, "stacked": stacked}


def eval_variants(nets: list[nn.Module], data: Data) -> dict[str, Callable[[], list[float]]]:
    def sequential() -> list[float]:
        return [evaluate_tensors(net, x, y)[0] for net, (x, y) in zip(nets, data)]

    def stacked() -> list[float]:
        return [loss for loss, _ in evaluate_stacked(nets, data)]

    return {"sequential": sequential, "stacked": stacked}


def measure(
    variants: dict[str, Callable[[], list[float]]], reps: int
) -> tuple[dict[str, list[float]], float]:
    """Seconds of each variant per repetition (order alternating), and max |loss difference|."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    losses: dict[str, list[float]] = {}
    names = list(variants)
    for rep in range(reps):
        for name in names[rep % 2:] + names[:rep % 2]:
            gc.collect()
            start = time.perf_counter()
            losses[name] = variants[name]()
            times[name].append(time.perf_counter() - start)
    diff = max(abs(a - b) for a, b in zip(losses["sequential"], losses["stacked"]))
    return times, diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    q = args.quick
    fashion = clients(FashionCNN, 6 if q else 20, 50 if q else 100, (1, 28, 28), 10)
    fashion_eval = clients(FashionCNN, 6 if q else 20, 100 if q else 400, (1, 28, 28), 10)
    resnet = clients(ResNet8, 4 if q else 10, 50 if q else 100, (3, 32, 32), 100)
    for net in fashion_eval[0]:
        net.eval()
    fit = {"lr": 0.05, "momentum": 0.9}
    workloads = {
        f"FashionCNN train {len(fashion[0])}x{fashion[1][0][0].shape[0]}, {2 if q else 5} ep, b50":
            train_variants(*fashion, epochs=2 if q else 5, batch_size=50, **fit),
        f"FashionCNN eval {len(fashion_eval[0])}x{fashion_eval[1][0][0].shape[0]}":
            eval_variants(*fashion_eval),
        f"ResNet8 train {len(resnet[0])}x{resnet[1][0][0].shape[0]}, 1 ep, b100":
            train_variants(*resnet, epochs=1, batch_size=100, **fit),
    }
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())} (1, 5, 15 min)")
    print("| workload | threads | sequential s | stacked s | stacked/sequential | max loss diff |")
    print("|---|---|---|---|---|---|")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for label, variants in workloads.items():
            for fn in variants.values():  # warm-up: lazy initialisation, allocator
                fn()
            times, diff = measure(variants, args.reps)
            seq, stk = times["sequential"], times["stacked"]
            ratio = statistics.median(b / a for a, b in zip(seq, stk))
            print(f"| {label} | {threads} | {statistics.median(seq):.2f} | {statistics.median(stk):.2f} "
                  f"| {ratio:.2f} | {diff:.1e} |", flush=True)
    print(f"load average at the end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
