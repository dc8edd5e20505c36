"""LIPS's own cost before and after a change, side by side in one process.

Exports ``lips_flwr`` as it was at ``--rev`` into a temporary directory under
the name ``lips_flwr_before`` and measures it against the working tree's
``lips_flwr``, interleaved round-robin:

- server: the aggregation step of ``LIPS(FedAvg())`` and ``LegacyLIPS(FedAvg())``
  on 100 replies, mask and no-mask rounds: LIPS's own seconds inside the call
  (the call minus its inner FedAvg) and its extra peak memory (tracemalloc);
- masking: ``sparsify`` (sensitivity, tau = 0.5) on the model's middle layers;
- client: ``lips_mod`` around a trivial train function (server mode and a
  client-mode mask round).

    python benchmarks/bench_before_after.py --rev c84fc3c            # ResNet8, ~4 minutes
    python benchmarks/bench_before_after.py --rev c84fc3c --models resnet8,resnet18
"""

from __future__ import annotations

import one_thread  # noqa: F401  (first: one BLAS thread, set before numpy loads)

import argparse
import importlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import numpy as np

from bench_server import (
    NUM_ROUNDS, TaskIdentity, TimedFedAvg, TimedLegacyFedAvg, client_manager, fit_result, grid,
    reply, to_record,
)
from common import (
    ROOT, client_models, code_line, load_line, machine_line, make_model, median, nbytes, paired_ratio,
    paired_times, peak_bytes, quiet_flower, table,
)
from flwr.app import ConfigRecord
from flwr.common import ndarrays_to_parameters


def export(rev: str, into: Path) -> str:
    """``lips_flwr`` at ``rev`` as the package ``lips_flwr_before`` under ``into``."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "lips_flwr"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "lips_flwr").rename(into / "lips_flwr_before")
    sys.path.insert(0, str(into))
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()


def server_rows(pkgs: dict, model_name: str, clients: int, reps: int) -> list[list[str]]:
    base = make_model(model_name)
    names = list(base)
    rows = []
    for api in ("message", "legacy"):
        replies = results = None  # free the other API's replies first  # noqa: F841
        bare = TimedFedAvg() if api == "message" else TimedLegacyFedAvg()
        strategies, inners = {}, {}
        if api == "message":
            previous, g = to_record(base), grid(clients)
            replies = [reply(m, 100, i + 1) for i, m in enumerate(client_models(base, clients))]
            for label, pkg in pkgs.items():
                inners[label] = TimedFedAvg()
                strategies[label] = pkg.strategies.LIPS(inners[label], num_rounds=NUM_ROUNDS)

            def configure(strategy, rnd):
                strategy.configure_train(rnd, previous, ConfigRecord(), g)

            def call(strategy, rnd):
                return strategy.aggregate_train(rnd, replies)
        else:
            previous, manager = ndarrays_to_parameters(list(base.values())), client_manager(clients)
            results = [fit_result(m, 100, str(i + 1))
                       for i, m in enumerate(client_models(base, clients))]
            for label, pkg in pkgs.items():
                inners[label] = TimedLegacyFedAvg()
                strategies[label] = pkg.strategies.LegacyLIPS(
                    inners[label], param_names=names, num_rounds=NUM_ROUNDS)

            def configure(strategy, rnd):
                strategy.configure_fit(rnd, previous, manager)

            def call(strategy, rnd):
                return strategy.aggregate_fit(rnd, results, [])
        for rnd, kind in ((1, "mask"), (2, "no mask")):
            own: dict[str, list[float]] = {label: [] for label in pkgs}

            def timed(label, rnd=rnd):
                start = time.perf_counter()
                call(strategies[label], rnd)
                own[label].append(time.perf_counter() - start - inners[label].last)

            variants = {"FedAvg": lambda rnd=rnd: call(bare, rnd)}
            for label in pkgs:
                configure(strategies[label], rnd)
                variants[label] = lambda label=label: timed(label)
            times = paired_times(variants, reps)
            peaks = {label: peak_bytes(lambda s=s: call(s, rnd)) for label, s in strategies.items()}
            bare_peak = peak_bytes(lambda: call(bare, rnd))
            fedavg = median(times["FedAvg"])
            before, after = (median(own[label][-reps:]) for label in pkgs)
            rows.append([
                api, model_name, kind, f"{fedavg:.3f}",
                f"{before * 1e3:.1f} ms", f"{after * 1e3:.1f} ms", f"{before / after:.1f}x",
                f"{1 + before / fedavg:.3f}", f"{1 + after / fedavg:.3f}",
                f"{(peaks['before'] - bare_peak) / nbytes(base):+.2f}",
                f"{(peaks['after'] - bare_peak) / nbytes(base):+.2f}",
            ])
            print(f"  {api} {model_name} {kind}", flush=True)
    return rows


def masking_rows(pkgs: dict, model_name: str, reps: int) -> list[list[str]]:
    prev = make_model(model_name)
    new = next(client_models(prev, 1, seed=2))
    layers = pkgs["after"].layers.select_layers(new)
    updates = pkgs["after"].masking.model_update(new, prev, layers)
    size = sum(new[n].nbytes for n in layers)
    variants = {"np.copy": lambda: [np.copy(new[n]) for n in layers]}
    for label, pkg in pkgs.items():
        # mask_layers was also named sparsify in the older trees this compares with
        mask = getattr(pkg.masking, "mask_layers", None) or pkg.masking.sparsify
        variants[label] = lambda mask=mask: mask(new, layers, 0.5, updates=updates)
    times = paired_times(variants, reps)
    out = []
    for label in ("np.copy", *pkgs):
        out.append([model_name, label, f"{median(times[label]) * 1e3:.1f} ms",
                    f"{size / median(times[label]) / 1e9:.2f} GB/s",
                    f"{paired_ratio(times[label], times['np.copy']):.1f}x"])
    return out


def client_rows(pkgs: dict, model_name: str, reps: int) -> list[list[str]]:
    from bench_client import ROUND, Setup  # noqa: PLC0415

    setup = Setup(model_name, "trivial")
    rows = []
    for situation in ("server mode", "client mode, mask"):
        config = setup.lips_config(situation)
        variants = {"bare": lambda: setup.message_train(setup.message({}), setup.context())}
        for label, pkg in pkgs.items():
            ctx = setup.context()
            state = pkg.clients.state

            def run(pkg=pkg, ctx=ctx, state=state):
                ctx.state[state.SIGNAL_KEY] = setup.signal
                ctx.state[state.SIGNAL_ROUND_KEY] = ConfigRecord({"round": ROUND - 1})
                return pkg.clients.lips_mod(setup.message(config), ctx, setup.message_train)
            variants[label] = run
        times = paired_times(variants, reps)
        bare = median(times["bare"])
        before, after = (median(times[label]) - bare for label in pkgs)
        rows.append([model_name, situation, f"{bare * 1e3:.1f} ms", f"{before * 1e3:+.1f} ms",
                     f"{after * 1e3:+.1f} ms", f"{before / after:.1f}x" if after > 0 else "-"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the 'before' commit")
    parser.add_argument("--models", default="resnet8", help="add resnet18: ~10 more minutes")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    quiet_flower()
    if TaskIdentity is not None:
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    tmp = Path(tempfile.mkdtemp(prefix="lips-before-"))
    try:
        rev = export(args.rev, tmp)
        pkgs = {}
        for label, name in (("before", "lips_flwr_before"), ("after", "lips_flwr")):
            pkgs[label] = importlib.import_module(name)
            for sub in ("strategies", "clients", "clients.state", "masking", "layers"):
                importlib.import_module(f"{name}.{sub}")
        print(machine_line())
        print(f"before: lips_flwr at {rev}; after: {code_line()}", flush=True)
        started = time.perf_counter()
        server, masking, client = [], [], []
        for model_name in args.models.split(","):
            reps = args.reps if model_name == "resnet8" else max(3, args.reps // 2)
            server += server_rows(pkgs, model_name, args.clients, reps)
            masking += masking_rows(pkgs, model_name, max(reps, 7))
            client += client_rows(pkgs, model_name, max(reps, 7))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nServer aggregation step, {args.clients} replies: LIPS's own time in the call "
          "(median), the ratio it implies, extra peak memory in model sizes")
    print(table(server, ["API", "model", "round", "FedAvg s", "own before", "own after",
                         "speed-up", "ratio before", "ratio after", "mem before", "mem after"]))
    print("\nsparsify (sensitivity, tau = 0.5) on the middle layers")
    print(table(masking, ["model", "code", "median", "throughput", "time / np.copy"]))
    print("\nlips_mod around a trivial train function: extra time per call over the bare function")
    print(table(client, ["model", "LIPS", "bare", "extra before", "extra after", "speed-up"]))
    print(f"\ntotal {time.perf_counter() - started:.0f}s; {load_line()}")


if __name__ == "__main__":
    main()
