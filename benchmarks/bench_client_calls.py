"""The batched Grid's cost per ClientApp call outside the clients' compute, before and after a change.

A GPU sweep on the batched Grid (the pre-registered study's regime (b):
100 clients x 200 rounds x 24 runs, ~960,000 ClientApp calls) is bound on
the CPU by what a call costs besides training and evaluating: receiving the
message, the mods (persistent state, FedBN, LIPS), loading the model, the
reply's records. This runs the paper app (``conf/prereg-fmnist-gpu-dir0.1.toml``,
``algorithm=lips``, with the study's checkpoint and client-state folder, or
without the folder: ``--no-state-files``) at a tiny compute (10 samples, 10
test samples, 1 epoch) on the sequential engine (or ``--engine stacked``),
for ``lips_flwr`` and ``examples/paper`` as they were at ``--rev`` and as they
are in the working tree, the Grid seeded as the experiment runner seeds a run
(every call seeded; the stacked engine keeps each client's generators), in
fresh processes that alternate (``--reps``), and splits each run's client time
into compute (inside ``local_compute()``, timed by a wrapper) and overhead
(the rest). ``--rev`` at 4afdc2b or later: the runs' code is imported from
there, the timing from this file.

    python benchmarks/bench_client_calls.py --rev 14f54fa              # 100 clients x 6 rounds, 3 reps: ~2 min
    python benchmarks/bench_client_calls.py --rev 14f54fa --reps 5 --rounds 10
    python benchmarks/bench_client_calls.py --rev HEAD --after-env OPENBLAS_NUM_THREADS=1  # the same code, one BLAS thread
    python benchmarks/bench_client_calls.py --rev HEAD --engine stacked --no-state-files  # the files' cost

Reported: the medians of overhead per call (ms), over all rounds and over
rounds 2..R (round 1 also builds each client's data, once a process: a sweep
of 200 rounds spreads that over all of them), compute per call, server
step per round (over all rounds, start-up included, and over rounds 2..R),
the process's CPU time (user and system, all its threads) per
call, and the median of the per-repetition ratios after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from io import BytesIO
from pathlib import Path

from common import ROOT, code_line, load_line, machine_line, median, paired_ratio


def child(rounds: int, nodes: int, state: str, engine: str = "sequential", state_files: bool = True) -> dict:
    """One run in this process (the code on ``sys.path``), its client time split.

    Compute: inside ``local_compute()`` on the sequential engine; on the
    stacked one, the Rendezvous leader's gathered calls (``_execute``).
    """
    sys.path.insert(0, str(Path.cwd() / "examples" / "paper"))
    from lips_paper.client_app import app as client_app
    from lips_paper.server_app import app as server_app

    from lips_flwr.experiments.batched import rendezvous, run_batched
    from lips_flwr.experiments.batched.calls import round_of
    from lips_flwr.experiments.batched.grid import BatchedGrid
    from lips_flwr.experiments.runner.apps import load_app, resolve_run_config
    from lips_flwr.experiments.task import training

    compute = [0.0]

    def timed(fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                compute[0] += time.perf_counter() - start
        return call

    rendezvous.Rendezvous._execute = timed(rendezvous.Rendezvous._execute)  # stacked: the leader's calls

    class Timed:  # sequential: the clients' calls of local_compute()
        train = staticmethod(timed(training.SEQUENTIAL.train))
        evaluate = staticmethod(timed(training.SEQUENTIAL.evaluate))

    conf = tomllib.loads((Path("examples/paper/conf/prereg-fmnist-gpu-dir0.1.toml")).read_text())
    conf.pop("federation")
    conf.update({"algorithm": "lips", "seed": 1000, "results-path": f"{state}/results.json",
                 "num-server-rounds": rounds, "samples-per-client": 10, "test-samples": 10,
                 "local-epochs": 1, "lips-state-dir": f"{state}/clients" if state_files else "",
                 "checkpoint-path": f"{state}/ck.npz"})
    # Each delivery's client time and compute, by round: round 1 also builds each client's data (once a
    # process), which a long sweep spreads over all its rounds; rounds 2..R show a call's cost then.
    by_round: dict[int, list[float]] = {}
    round_starts: dict[int, float] = {}  # each round's first delivery's start (perf_counter)
    deliver = BatchedGrid._deliver

    def timed_deliver(grid, timeout):
        rnd = max((r for r in (round_of(msg) for msg in grid._pending.values()) if r is not None),
                  default=0)  # (the round of the pending messages; 0: none said)
        calls, before = len(grid._pending), (grid.client_seconds, compute[0])
        round_starts.setdefault(rnd, time.perf_counter())
        deliver(grid, timeout)
        totals = by_round.setdefault(rnd, [0.0, 0.0, 0])
        totals[0] += grid.client_seconds - before[0]
        totals[1] += compute[0] - before[1]
        totals[2] += calls

    BatchedGrid._deliver = timed_deliver
    with training.computing_with(Timed()):
        start, cpu = time.perf_counter(), os.times()
        config = resolve_run_config(load_app(Path.cwd() / "examples" / "paper"), conf)
        grid = run_batched(server_app, client_app, run_config=config, num_nodes=nodes,
                           engine=engine, seed=conf["seed"])  # (seeded as the runner seeds a run)
        wall, cpu_end = time.perf_counter() - start, os.times()
    import lips_flwr

    calls = 2 * nodes * rounds  # a train and an evaluate call per client and round
    return {"code": str(Path(lips_flwr.__file__).parents[1]),
            "overhead_ms": (grid.client_seconds - compute[0]) / calls * 1e3,
            "later_overhead_ms": later_overhead_ms(by_round),
            "compute_ms": compute[0] / calls * 1e3,
            "server_ms": (wall - grid.client_seconds) / rounds * 1e3,
            "later_server_ms": later_server_ms(by_round, round_starts, start + wall),
            "cpu_ms": (cpu_end.user + cpu_end.system - cpu.user - cpu.system) / calls * 1e3}


def later_overhead_ms(by_round: dict[int, list[float]]) -> float:
    """Overhead per call (ms) in the rounds after the first (``by_round``: round -> [client s, compute s,
    calls])."""
    later = [totals for rnd, totals in by_round.items() if rnd > 1]
    calls = sum(totals[2] for totals in later)
    return sum(totals[0] - totals[1] for totals in later) / calls * 1e3 if calls else float("nan")


def later_server_ms(by_round: dict[int, list[float]], round_starts: dict[int, float], end: float) -> float:
    """The server step per round (ms) in the rounds after the first: from a round's first delivery to the
    next round's (the last: to the run's end), less the round's client time. Round 1's also holds the
    run's start-up (the app, the first model, a collection), which a long sweep spreads over all rounds."""
    rounds = sorted(r for r in round_starts if r > 1)
    steps = [(round_starts.get(r + 1, end) - round_starts[r] - by_round[r][0]) for r in rounds]
    return sum(steps) / len(steps) * 1e3 if steps else float("nan")


def export(rev: str, into: Path) -> None:
    """``lips_flwr`` and ``examples/paper`` as they were at ``rev``."""
    archive = subprocess.run(["git", "archive", rev, "lips_flwr", "examples/paper"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the 'before' commit")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--after-env", nargs="*", default=[], metavar="KEY=VALUE",
                        help="environment of the 'after' runs only (e.g. OPENBLAS_NUM_THREADS=1)")
    parser.add_argument("--engine", choices=("sequential", "stacked"), default="sequential",
                        help="the batched Grid's engine (stacked: the GPU's; on a CPU its compute is slow)")
    parser.add_argument("--no-state-files", action="store_true",
                        help="no client state folder (lips-state-dir): what the clients' state files cost")
    parser.add_argument("--child", nargs=5, metavar=("ROUNDS", "NODES", "STATE", "ENGINE", "FILES"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), int(args.child[1]), args.child[2], args.child[3],
                               args.child[4] == "files")))
        return
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    after_env = dict(pair.split("=", 1) for pair in args.after_env)
    print(machine_line(), "|", code_line(), "| before:", args.rev, "| after's environment:", after_env or "-")
    results: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        export(args.rev, before)
        for rep in range(args.reps):
            for side in ("before", "after") if rep % 2 == 0 else ("after", "before"):
                state = Path(tmp) / f"state-{side}-{rep}"
                tree = before if side == "before" else ROOT
                out = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--rev", args.rev, "--child",
                     str(args.rounds), str(args.nodes), str(state), args.engine,
                     "none" if args.no_state_files else "files"],
                    cwd=tree, env={**env, "PYTHONPATH": str(tree), **(after_env if side == "after" else {})},
                    capture_output=True, text=True, check=True)
                results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
                if Path(results[side][-1].pop("code")).resolve() != tree.resolve():
                    raise SystemExit(f"the {side} run imported another lips_flwr than {tree}")
                print(f"rep {rep} {side:6s} {results[side][-1]} ({load_line()})", flush=True)
    files = ", no client state files" if args.no_state_files else ""
    print(f"\n{args.nodes} clients x {args.rounds} rounds, {args.engine} engine{files}, {args.reps} reps, "
          "medians:")
    print("| part | before | after | after / before |\n|---|---|---|---|")
    for key, label in (("overhead_ms", "client overhead per call"),
                       ("later_overhead_ms", "client overhead per call, rounds 2..R"),
                       ("compute_ms", "client compute per call"),
                       ("server_ms", "server step per round"),
                       ("later_server_ms", "server step per round, rounds 2..R"),
                       ("cpu_ms", "process CPU time per call (all threads)")):
        b, a = [r[key] for r in results["before"]], [r[key] for r in results["after"]]
        print(f"| {label} | {median(b):.2f} ms | {median(a):.2f} ms | {paired_ratio(a, b):.3f} |")


if __name__ == "__main__":
    main()
