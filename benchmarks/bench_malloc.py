"""``lips-flwr compare`` walls with the local Ray's malloc settings against glibc's defaults.

A sweep's local Ray starts its processes with ``MALLOC_SETTINGS``
(``lips_flwr.experiments.runner.dispatch``: one malloc arena, freed blocks up
to 64 MB kept, 32 MB before glibc 2.35): without them a run faulted each round's new replies and
tensors in again page by page. Each variant is a whole ``lips-flwr compare``
process of the paper app (one seed, two arms) into a fresh folder, as a
user runs it; ``glibc`` sets ``MALLOC_ARENA_MAX=0`` (glibc's own default) in
the command's environment, which the sweep then keeps to for all of them.
Two workloads: ``stacked``, the study's GPU-regime config (100 clients,
FashionCNN) at a tiny compute on the stacked engine, and ``sequential``,
the main job's config (20 clients) on the sequential engine; ``--rounds``
rounds each. The variants alternate, the order turning every repetition;
the table gives median walls and the median of the paired ratios. Not run
by CI.

    python benchmarks/bench_malloc.py                 # 4 rounds, 5 repetitions
    python benchmarks/bench_malloc.py --reps 1 --rounds 2   # a smoke run
"""

from __future__ import annotations

import argparse
import os
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

CONF = ROOT / "examples" / "paper" / "conf"
WORKLOADS = {
    "stacked": ["--engine", "stacked", "--run-config", str(CONF / "prereg-fmnist-gpu-dir0.1.toml"),
                "samples-per-client=20", "test-samples=20", "local-epochs=1", "batch-size=20"],
    "sequential": ["--engine", "sequential", "--run-config", str(CONF / "fashion-mnist-quick.toml")],
}
VARIANTS = {"settings": {}, "glibc": {"MALLOC_ARENA_MAX": "0"}}


def compare_wall(out: Path, rounds: int, workload: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one ``lips-flwr compare`` process (``RuntimeError`` with its output if it failed)."""
    app = ROOT / "examples" / "paper"
    cmd = [sys.executable, "-m", "lips_flwr.experiments.compare.cli", "compare", str(app), "--seeds", "1",
           "--out", str(out), *workload, f"num-server-rounds={rounds}"]
    return process_wall(cmd, env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if any(name.startswith("MALLOC_") for name in os.environ):
        raise SystemExit("run it without MALLOC_* variables set: the 'settings' variant would keep to them")
    print(machine_line())
    print(code_line())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload, options in WORKLOADS.items():
            walls: dict[str, list[float]] = {name: [] for name in VARIANTS}
            names = list(VARIANTS)
            print(load_line())
            for rep in range(args.reps):
                for name in rotated(names, rep):
                    out = Path(tmp) / f"out-{workload}-{rep}-{name}"
                    walls[name].append(compare_wall(out, args.rounds, options, VARIANTS[name]))
                    shutil.rmtree(out)
            print(load_line())
            rows.append([workload, f"{median(walls['settings']):.1f}", f"{median(walls['glibc']):.1f}",
                         f"{paired_ratio(walls['settings'], walls['glibc']):.3f}",
                         ", ".join(f"{a / b:.2f}" for a, b in zip(walls["settings"], walls["glibc"]))])
    print(table(rows, ["workload", "settings: median wall (s)", "glibc's defaults (s)", "paired ratio",
                       "each repetition"]))


if __name__ == "__main__":
    main()
