"""``lips-flwr compare`` walls by ``--jobs`` on a small recurrent app: is ``--jobs 2`` ever slower?

The app is the one of the done-when test of issue 35
(``tests/apps/gru-fedavgm``, a GRU under FedAvgM with LIPS swapped in by the
README's lines, on sequences made here), compared over ``--seeds`` (2 runs
per seed) at ``--rounds`` rounds on ``--nodes`` nodes. Each variant is a
whole ``lips-flwr compare`` process into a fresh folder, as a user runs it:

- ``jobs=1``: one run at a time, with every core's threads;
- ``jobs=2``: two at a time, ``cores // 2`` threads each;
- ``default``: no ``--jobs`` (the CLI's default; the runner's own default is
  ``default_jobs``: the largest divisor of the runs that is at most the cores).

Before issue 35 every run kept torch's default threads (all the cores), and
two runs at once oversubscribed 2 cores: 234.6 s against 44.8 s. The variants
run interleaved, the order rotating every repetition (``--reps``); the table
gives the median walls and the median ratio to ``jobs=1`` (below 1: faster).
Timings on a shared machine move with its load: the load average is printed.
Not run by CI.

    python benchmarks/bench_jobs.py                       # 6 seeds x 2 arms, 10 rounds, 3 reps
    python benchmarks/bench_jobs.py --seeds 2 --rounds 3 --reps 1   # a smoke run
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from common import (
    ROOT,
    code_line,
    load_line,
    machine_line,
    median,
    paired_ratio,
    process_wall,
    rotated,
    table,
)

sys.path[:0] = [str(ROOT / "tests" / "integration")]
from test_compare_jobs_and_stop import SWAP, make_sequences  # noqa: E402
from test_swap_in import APPS, _apply  # noqa: E402

VARIANTS = {"jobs=1": ["--jobs", "1"], "jobs=2": ["--jobs", "2"], "default": []}


def compare_wall(app: Path, out: Path, seeds: int, rounds: int, nodes: int, extra: list[str]) -> float:
    """Wall seconds of one ``lips-flwr compare`` process (``RuntimeError`` with its output if it failed)."""
    cmd = [sys.executable, "-m", "lips_flwr.experiments.compare.cli", "compare", str(app), "--seeds",
           ",".join(str(1000 + s) for s in range(seeds)), "--num-supernodes", str(nodes), "--engine",
           "sequential", "--out", str(out), "--run-config", f"num-server-rounds={rounds}",
           f"data-path='{app.parent / 'sequences.npz'}'", *extra]
    return process_wall(cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "gru-fedavgm"
        shutil.copytree(APPS / "gru-fedavgm", app, ignore=shutil.ignore_patterns("__pycache__"))
        _apply(app, SWAP)
        make_sequences(Path(tmp) / "sequences.npz")
        walls: dict[str, list[float]] = {name: [] for name in VARIANTS}
        names = list(VARIANTS)
        print(load_line())
        for rep in range(args.reps):
            for name in rotated(names, rep):
                out = Path(tmp) / f"out-{rep}-{name}"
                walls[name].append(compare_wall(app, out, args.seeds, args.rounds, args.nodes, VARIANTS[name]))
                shutil.rmtree(out)
        print(load_line())
    rows = [[name, f"{median(values):.1f}", f"{paired_ratio(values, walls['jobs=1']):.2f}"]
            for name, values in walls.items()]
    print(table(rows, ["variant", "median wall (s)", "wall / jobs=1"]))


if __name__ == "__main__":
    main()
