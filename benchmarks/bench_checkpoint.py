"""Cost of the per-round strategy checkpoint: a round's server work with and without ``checkpoint_path``.

A Message API ``LIPS(FedAvg())`` with ``checkpoint_path=`` writes the
checkpoint after round ``r - 1`` at the start of round ``r``, in
``configure_train`` (``_save_checkpoint`` -> ``lips_flwr.strategies.resume.keeper.CheckpointKeeper.save``:
the LIPS core's state, the wrapped strategies' model-shaped state, Python's
``random`` state and the metrics history, written by ``write_npz`` (an ``np.savez`` archive) to a
temporary file beside the target, flushed, **fsync'ed** and ``os.replace``'d).
So what is timed here is the train half of a round's server work,
``configure_train(r)`` + ``aggregate_train(r)`` of N client replies
(``Mock(spec=Message)`` with real ArrayRecords, as in bench_server.py), for
four strategies side by side, interleaved round-robin:

- ``LIPS(FedAvg())`` vs the same with ``checkpoint_path=``, inertia off;
- the same pair with ``inertia_t0=2`` (the inertia tracker keeps two copies of
  the tracked layers: the checkpoint holds the reference one; the previous
  round's equals the saved model and is stored once).

Each strategy first runs rounds 1 and 2 (the layer choice, the inertia
reference of round 2), its metrics history is filled up to round ``r - 1`` as
``start()`` records it, then a mask round ``r`` (default 6; ``T = 300``,
``every = 5``, ``tau0 = 0.5``) and the round after it (no mask) are measured.
Every repetition writes the checkpoint again (the strategy's "already saved
this round" marker is cleared before the call), as one round of a run does.

Reported per model and round: the model and checkpoint file size, the save's
own seconds (``lips-checkpoint-seconds``, the metric the strategy reports, in
the same call), the aggregate_train seconds, the round without and with the
checkpoint, the median of the paired ratios with/without, ``1 + save / round``
(the same ratio without the noise of two separate calls), and the save's
tracemalloc peak. The file goes to a temporary folder (``--dir``, default the
system's temporary folder); the script prints its filesystem and whether it is
the repository's.

    python benchmarks/bench_checkpoint.py                 # resnet8 + resnet18, 20 replies, ~1.5 min on 2 cores
    python benchmarks/bench_checkpoint.py --models resnet8 --clients 100 --reps 9
    python benchmarks/bench_checkpoint.py --round 296     # late in a 300-round run: 295 rounds of history
    python benchmarks/bench_checkpoint.py --smoke         # resnet8, 4 replies, 2 reps (seconds)
"""

from __future__ import annotations

import one_thread  # noqa: F401  (first: one BLAS thread, set before numpy loads)

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import (
    MB, ROOT, client_models, code_line, load_line, machine_line, make_model, median, nbytes, num_params,
    paired_ratio, paired_times, peak_bytes, quiet_flower, table,
)

from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg

from lips_flwr.strategies import LIPS
from lips_flwr.strategies.adapters.message_loop import empty_history

try:  # Messages built by configure_train need the identity of a running task
    from flwr.supercore.task_identity import TaskIdentity
except ImportError:
    TaskIdentity = None

sys.path.insert(0, str(ROOT / "tests" / "unit"))
from flower_fakes import grid, reply, to_record  # noqa: E402

NUM_ROUNDS = 300  # the paper's T; rounds 1, 6, 11, ... mask
INERTIA_T0 = 2


def filesystem(path: Path) -> str:
    """``device on mount (fstype)`` of ``path``, from /proc/mounts (the longest matching mount)."""
    best = ("?", "?", "?")
    try:
        real = os.path.realpath(path)
        with open("/proc/mounts") as f:
            for line in f:
                dev, mount, fstype = line.split()[:3]
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and (best[1] == "?" or len(mount) >= len(best[1])):
                    best = (dev, mount, fstype)
    except OSError:
        pass
    return f"{best[0]} on {best[1]} ({best[2]})"


class Variant:
    """One strategy and how to run one round of it: configure_train + aggregate_train."""

    def __init__(self, inertia: bool, path: Path | None, replies, model_record, config, g) -> None:
        self.strategy = LIPS(FedAvg(), num_rounds=NUM_ROUNDS,
                             inertia_t0=INERTIA_T0 if inertia else None,
                             checkpoint_path=None if path is None else str(path))
        self.path = path
        self.replies, self.model, self.config, self.grid = replies, model_record, config, g
        if path is not None:
            self.strategy._lips_history = empty_history()  # as start() does with a checkpoint_path
        self.saves: list[float] = []
        self.aggregates: list[float] = []
        self.metrics = None

    def round(self, rnd: int) -> None:
        s = self.strategy
        s._lips_keeper.saved_round = None  # write again on every repetition, as each round does
        list(s.configure_train(rnd, self.model, self.config, self.grid))
        start = time.perf_counter()
        arrays, metrics = s.aggregate_train(rnd, self.replies)
        self.model = arrays  # the next round starts from this aggregate, as in a run
        self.aggregates.append(time.perf_counter() - start)
        if self.path is not None:
            if "lips-checkpoint-seconds" in metrics:  # round 1 has no round before it to save
                self.saves.append(float(metrics["lips-checkpoint-seconds"]))
            s._lips_history["train"][rnd] = dict(metrics)  # as start()'s loop records it
        self.metrics = metrics

    def fill_history(self, upto: int) -> None:
        """Rounds 3..upto of the history, each a copy of the last round's train metrics."""
        if self.path is None or self.metrics is None:
            return
        for r in range(3, upto + 1):
            self.strategy._lips_history["train"].setdefault(r, dict(self.metrics))

    def save_only(self, rnd: int) -> None:
        """The write alone (for its memory peak)."""
        self.strategy._lips_keeper.saved_round = None
        self.strategy._save_checkpoint(rnd - 1, self.model)


def measure(model_name: str, clients: int, reps: int, mask_round: int, folder: Path) -> list[dict]:
    base = make_model(model_name, seed=0)
    record = to_record(base)
    replies = [reply(m, 100, i + 1) for i, m in enumerate(client_models(base, clients))]
    g, config = grid(clients), ConfigRecord()
    variants = {}
    for inertia in (False, True):
        tag = "inertia" if inertia else "plain"
        variants[(inertia, False)] = Variant(inertia, None, replies, record, config, g)
        variants[(inertia, True)] = Variant(
            inertia, folder / f"{model_name}-{tag}.npz", replies, record, config, g)
    for v in variants.values():  # rounds 1 and 2: layer choice, inertia reference
        v.round(1)
        v.round(2)
        v.fill_history(mask_round - 1)
    rows = []
    for rnd in (mask_round, mask_round + 1):
        for v in variants.values():
            v.saves.clear()
            v.aggregates.clear()
        names = {f"{'inertia' if i else 'plain'}-{'ckpt' if c else 'none'}": v
                 for (i, c), v in variants.items()}
        times = paired_times({n: (lambda v=v: v.round(rnd)) for n, v in names.items()}, reps)
        for inertia in (False, True):
            tag = "inertia" if inertia else "plain"
            bare, ckpt = variants[(inertia, False)], variants[(inertia, True)]
            saves, aggregates = ckpt.saves[-reps:], bare.aggregates[-reps:]
            without, with_ = times[f"{tag}-none"], times[f"{tag}-ckpt"]
            peak = peak_bytes(lambda: ckpt.save_only(rnd))
            history = json.dumps(ckpt.strategy._lips_history).encode()
            rows.append({
                "model": model_name, "params": num_params(base), "model_bytes": nbytes(base),
                "inertia": inertia, "round": rnd,
                "kind": "mask" if ckpt.metrics.get("lips-mask-round") else "no mask",
                "file_bytes": ckpt.path.stat().st_size, "history_bytes": len(history),
                "save": median(saves), "aggregate": median(aggregates),
                "without": median(without), "with": median(with_),
                "ratio": paired_ratio(with_, without),
                "own_ratio": 1 + median(saves) / median(without),
                "peak": peak,
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet8,resnet18", help="comma-separated: resnet8, resnet18")
    parser.add_argument("--clients", type=int, default=20, help="client replies aggregated per round")
    parser.add_argument("--reps", type=int, default=0,
                        help="repetitions per variant (default: 9 for resnet8, 5 for resnet18)")
    parser.add_argument("--round", type=int, default=6,
                        help="the mask round measured (1, 6, 11, ... up to 296); the next round is the "
                             "round without a mask; the history holds the rounds before it")
    parser.add_argument("--dir", default=None,
                        help="folder for the checkpoint files (default: the system's temporary folder)")
    parser.add_argument("--smoke", action="store_true", help="quick check: resnet8, 4 replies, 2 reps")
    args = parser.parse_args()
    if args.smoke:
        args.models, args.clients, args.reps = "resnet8", 4, 2
    if args.round < 6 or (args.round - 1) % 5 or args.round + 1 > NUM_ROUNDS:
        parser.error("--round must be a mask round after round 2: 6, 11, ..., 296")
    quiet_flower()
    if TaskIdentity is not None:
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    print(machine_line(), flush=True)
    print(code_line(), flush=True)
    folder = Path(tempfile.mkdtemp(prefix="lips-bench-checkpoint-", dir=args.dir))
    same = "the repository's" if os.stat(folder).st_dev == os.stat(ROOT).st_dev else "NOT the repository's"
    print(f"checkpoint files in {folder}: {filesystem(folder)}, {same} filesystem "
          f"(repository: {filesystem(ROOT)}); each write is fsync'ed", flush=True)
    started = time.perf_counter()
    rows = []
    try:
        for model_name in args.models.split(","):
            reps = args.reps or (9 if model_name == "resnet8" else 5)
            rows += measure(model_name, args.clients, reps, args.round, folder)
            print(f"  measured {model_name} ({time.perf_counter() - started:.0f}s)", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print(f"\nTrain half of a round's server work, {args.clients} replies: configure_train(r) + "
          f"aggregate_train(r) of LIPS(FedAvg()), median seconds. The checkpoint (after round r-1) is "
          f"written in configure_train; save: its lips-checkpoint-seconds in the same call (fsync "
          f"included); aggregate: aggregate_train alone (no checkpoint); ratio: median of the paired "
          f"round calls with/without checkpoint; 1+save/round: the same from the save's own time; "
          f"peak: tracemalloc peak of the save alone")
    print(table(
        [[f"{r['model']} ({r['params'] / 1e6:.2f}M)", f"{r['model_bytes'] / MB:.1f}",
          f"t0={INERTIA_T0}" if r["inertia"] else "off", f"{r['round']} ({r['kind']})",
          f"{r['file_bytes'] / MB:.1f}", f"{r['history_bytes'] / 1024:.0f}",
          f"{r['save']:.3f}", f"{r['file_bytes'] / MB / r['save']:.0f}", f"{r['aggregate']:.3f}", f"{r['without']:.3f}", f"{r['with']:.3f}",
          f"{r['ratio']:.3f}", f"{r['own_ratio']:.3f}", f"{r['peak'] / MB:.1f}"]
         for r in rows],
        ["model", "model MB", "inertia", "round", "file MB", "history KB", "save s", "save MB/s", "aggregate s",
         "round s", "round+ckpt s", "ratio", "1+save/round", "save peak MB"]))
    print(f"\ntotal {time.perf_counter() - started:.0f}s; {load_line()}")


if __name__ == "__main__":
    main()
