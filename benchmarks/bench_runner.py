"""The experiment runner's own cost: (a) beyond its runs' compute, (b) ``--jobs 2`` against ``--jobs 1``.

(a) One run of the paper app on the main job's config
(``conf/fashion-mnist-quick.toml``: 20 clients x 100 Fashion-MNIST samples,
``fashion-cnn``, 2 local epochs; ``--rounds`` rounds, sequential engine), two
ways, interleaved with a rotating order (``--reps``):

- ``runner``: :func:`lips_flwr.experiments.runner.sweep.run_sweep` of that one run
  into a fresh folder, timed around the call in this process: the run's
  process start (``spawn``), the spec's resolution (app and code digests),
  its staging folder, the run with the runner's observer, the checkpoint and
  clients' state the runner has the app keep (``checkpoint-path``,
  ``lips-state-dir``), the result file with its provenance;
- ``floor``: the same run (run config, seed, results file) through plain
  :func:`~lips_flwr.experiments.batched.run_batched` in a fresh Python
  process with nothing else (``python benchmarks/bench_runner.py --floor
  SPEC``), timed from its start to its exit.

The runner's cost is the median of the per-repetition ratios runner/floor
(target: <= 1.05).

(b) A 12-run A/B sweep, as ``lips-flwr compare`` makes it (6 seeds x the app
with LIPS off and as written), on the same config at ``--sweep-rounds``
rounds, each sweep in a fresh process (its imports, Ray's start and stop
included) into a fresh folder, in a rotating order: ``run_sweep`` on Ray
with ``jobs=1`` and with ``jobs=2`` (target: jobs=1 / jobs=2 >= 1.7 on 2
cores), Ray's start-up seconds as the sweep prints them, and with
``--pool-rev REV`` the same sweep at ``jobs=1`` by the code of commit REV
(a git worktree on ``PYTHONPATH``): the process pool the runner had before
Ray, ``bce7b1d`` (target: Ray / pool <= 1.05).

Every process gets one BLAS thread (``one_thread``, inherited), as the paper
ClientApp keeps torch to one. Timings on a shared machine move with its load:
the load average is printed before and after each part.

    python benchmarks/bench_runner.py                     # (a) 5 rounds x 3 reps, (b) 3 rounds x 1 rep
    python benchmarks/bench_runner.py --part a --rounds 10 --reps 5
    python benchmarks/bench_runner.py --part b --pool-rev bce7b1d --sweep-reps 1
    python benchmarks/bench_runner.py --smoke             # 2 rounds, 1 rep each (checks that it runs)
"""

from __future__ import annotations

import one_thread  # noqa: F401  (first: one BLAS thread, set before numpy loads)

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, code_line, load_line, machine_line, median, paired_ratio, rotated, table

APP = ROOT / "examples" / "paper"
CONF = APP / "conf" / "fashion-mnist-quick.toml"
SEEDS = tuple(range(1000, 1006))


def quick_config(rounds: int) -> tuple[dict, int]:
    """The main job's run-config overrides at ``rounds`` rounds, and its node count."""
    from lips_flwr.experiments.runner.apps import num_supernodes, parse_overrides

    values, federation = parse_overrides([str(CONF), f"num-server-rounds={rounds}"])
    return values, num_supernodes(federation)


def floor_child(spec_path: str) -> None:
    """The floor's process: the run through plain ``run_batched``, nothing else."""
    spec = json.loads(Path(spec_path).read_text())
    from lips_flwr.experiments.runner.apps import import_components, load_app, resolve_run_config
    from lips_flwr.experiments.batched import run_batched

    app = load_app(APP)
    server_app, client_app = import_components(app)
    values = {**spec["values"], "seed": spec["seed"], "results-path": spec["results"]}
    grid = run_batched(server_app, client_app, run_config=resolve_run_config(app, values),
                       num_nodes=spec["nodes"], engine="sequential", seed=spec["seed"])
    if grid.first_error:
        raise SystemExit(f"a client failed: {grid.first_error}")


def run_floor(values: dict, nodes: int, seed: int, folder: Path) -> float:
    spec = folder / "floor.json"
    spec.write_text(json.dumps({"values": values, "nodes": nodes, "seed": seed,
                                "results": str(folder / "floor-results.json")}))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--floor", str(spec)], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"the floor's run failed:\n{proc.stderr[-3000:]}")
    return seconds


def run_runner(values: dict, nodes: int, seed: int, folder: Path) -> float:
    from lips_flwr.experiments.runner.runs import RunSpec
    from lips_flwr.experiments.runner.sweep import run_sweep

    spec = RunSpec(APP, "run", seed, values, num_nodes=nodes, engine="sequential")
    start = time.perf_counter()
    run_sweep([spec], folder / "runner", progress=lambda line: None)
    return time.perf_counter() - start


def part_a(rounds: int, reps: int, work: Path) -> list[list[str]]:
    import lips_flwr.experiments.runner.sweep  # noqa: F401 - the sweep's own imports, once per sweep, not per run

    values, nodes = quick_config(rounds)
    variants = {"runner": run_runner, "floor": run_floor}
    times: dict[str, list[float]] = {name: [] for name in variants}
    print(f"(a) one run, {nodes} clients, {rounds} rounds; {load_line()}", flush=True)
    for rep in range(reps):
        order = list(variants)[rep % 2:] + list(variants)[:rep % 2]
        for name in order:
            folder = work / f"a-{name}-{rep}"
            folder.mkdir()
            times[name].append(variants[name](values, nodes, SEEDS[0], folder))
            shutil.rmtree(folder, ignore_errors=True)
            print(f"  rep {rep + 1}/{reps} {name}: {times[name][-1]:.1f}s", flush=True)
    ratio = paired_ratio(times["runner"], times["floor"])
    print(f"  {load_line()}", flush=True)
    return [["(a) run_sweep, one run", f"{median(times['runner']):.2f}", f"{ratio:.3f}", "<= 1.05"],
            ["(a) run_batched, fresh process", f"{median(times['floor']):.2f}", "1.000", ""]]


def sweep_child(spec_path: str) -> None:
    """A sweep's process: ``run_sweep`` of the 12-run A/B sweep, as the code on ``sys.path`` has it."""
    spec = json.loads(Path(spec_path).read_text())
    from lips_flwr.experiments.compare import Comparison
    from lips_flwr.experiments.runner.sweep import run_sweep

    specs = Comparison(APP, SEEDS, run_config=spec["values"], num_nodes=spec["nodes"],
                       engine="sequential").specs()
    run_sweep(specs, spec["out"], jobs=spec["jobs"], progress=lambda line: print(line, flush=True))


def run_sweep_process(values: dict, nodes: int, jobs: int, folder: Path,
                      code: Path) -> tuple[float, float | None]:
    """The sweep in a fresh process importing ``lips_flwr`` from ``code``; its wall and Ray's start."""
    spec = folder / "sweep.json"
    spec.write_text(json.dumps({"values": values, "nodes": nodes, "jobs": jobs, "out": str(folder / "out")}))
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--sweep", str(spec)], capture_output=True, text=True,
                          cwd=folder, env=env, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"the sweep failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    started = re.search(r"Ray started in ([0-9.]+) s", proc.stdout)
    return seconds, float(started.group(1)) if started else None


def part_b(rounds: int, reps: int, work: Path, pool_rev: str | None) -> list[list[str]]:
    """The 12-run sweep through Ray at --jobs 1 and 2, and (``pool_rev``) the process pool at that commit."""
    values, nodes = quick_config(rounds)
    code = {"ray": ROOT}
    if pool_rev:
        code["pool"] = work / "pool-code"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(code["pool"]), pool_rev],
                       check=True, capture_output=True)
    variants = [("ray", 1), ("ray", 2)] + ([("pool", 1)] if pool_rev else [])
    times: dict[tuple[str, int], list[float]] = {v: [] for v in variants}
    starts: list[float] = []
    print(f"(b) 12 runs (A/B x {len(SEEDS)} seeds), {nodes} clients, {rounds} rounds; "
          f"{'pool at ' + pool_rev + '; ' if pool_rev else ''}{load_line()}", flush=True)
    try:
        for rep in range(reps):
            for name, jobs in rotated(variants, rep):
                folder = work / f"b-{name}-{jobs}-{rep}"
                folder.mkdir()
                seconds, ray_start = run_sweep_process(values, nodes, jobs, folder, code[name])
                times[(name, jobs)].append(seconds)
                if ray_start is not None:
                    starts.append(ray_start)
                shutil.rmtree(folder, ignore_errors=True)
                print(f"  rep {rep + 1}/{reps} {name} jobs={jobs}: {seconds:.1f}s"
                      + (f" (Ray started in {ray_start:.1f} s)" if ray_start is not None else ""), flush=True)
    finally:
        if pool_rev:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(code["pool"])],
                           check=False, capture_output=True)
    print(f"  {load_line()}", flush=True)
    speedup = paired_ratio(times[("ray", 1)], times[("ray", 2)])
    rows = [["(b) 12 runs on Ray, --jobs 1", f"{median(times[('ray', 1)]):.2f}", "1.000",
             f"Ray start-up {median(starts):.1f} s (median)"],
            ["(b) 12 runs on Ray, --jobs 2", f"{median(times[('ray', 2)]):.2f}", f"{1 / speedup:.3f}",
             f"speed-up {speedup:.2f}x (>= 1.7)"]]
    if pool_rev:
        cost = paired_ratio(times[("ray", 1)], times[("pool", 1)])
        rows.append([f"(b) 12 runs, process pool at {pool_rev}, --jobs 1",
                     f"{median(times[('pool', 1)]):.2f}", f"{1 / cost:.3f}",
                     f"Ray / pool {cost:.3f} (<= 1.05)"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("a", "b", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=5, help="(a): rounds of the run")
    parser.add_argument("--reps", type=int, default=3, help="(a): repetitions per variant")
    parser.add_argument("--sweep-rounds", type=int, default=3, help="(b): rounds of each of the 12 runs")
    parser.add_argument("--sweep-reps", type=int, default=1, help="(b): repetitions per jobs setting")
    parser.add_argument("--smoke", action="store_true", help="2 rounds, 1 repetition each: that it runs")
    parser.add_argument("--pool-rev", default=None,
                        help="(b): also the process pool of this commit (the runner before Ray: bce7b1d)")
    parser.add_argument("--floor", default=None, help=argparse.SUPPRESS)  # the floor's own process
    parser.add_argument("--sweep", default=None, help=argparse.SUPPRESS)  # a sweep's own process
    args = parser.parse_args()
    if args.floor:
        floor_child(args.floor)
        return
    if args.sweep:
        sweep_child(args.sweep)
        return
    if args.smoke:
        args.rounds = args.sweep_rounds = 2  # (the quick config compares round 2 onwards: inertia-t0 = 2)
        args.reps = args.sweep_reps = 1
    print(machine_line(), flush=True)
    print(code_line(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="lips-bench-runner-"))
    rows = []
    try:
        if args.part in ("a", "both"):
            rows += part_a(args.rounds, args.reps, work)
        if args.part in ("b", "both"):
            rows += part_b(args.sweep_rounds, args.sweep_reps, work, args.pool_rev)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nMedian seconds; ratio: median of the per-repetition ratios to the row marked 1.000 "
          "(a: runner / floor; b: to Ray at jobs=1).")
    print(table(rows, ["variant", "median s", "ratio", "target"]))


if __name__ == "__main__":
    main()
