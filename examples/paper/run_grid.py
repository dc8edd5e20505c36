"""Run the paper app over experiments x algorithms x seeds, then print a table and plot.

    python examples/paper/run_grid.py examples/paper/conf/fashion-mnist-quick.toml \
        --algorithms fedbn,lips --seeds 0

Each conf file is a run config (plus a ``[federation]`` table for
``--federation-config``). Every run writes ``<algorithm>-seed<k>.json`` into a
fresh staging folder beside ``<out>/<conf>``; only when every run of the grid
has finished, and each results file shows that clients trained, do the files
replace ``<out>/<conf>``'s results (older ``*-seed<k>.json`` there are
removed): a grid stopped or failed half-way leaves the previous results whole,
never a mix of old and new. A run whose clients all failed (e.g. no dataset)
stops the grid with a non-zero exit and the clients' first error.

The table gives the client-mean test accuracy, mean +- std over seeds, of the
last and the best round, after aggregation (the model clients receive) and
before (the model right after local training), and each algorithm's paired
difference to FedBN on the same seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import plot_accuracy  # noqa: E402

from lips_flwr.experiments.local_flower import first_error, local_flower  # noqa: E402

APP = Path(__file__).resolve().parent
ROOT = APP.parents[1]
RESULTS_NAME = re.compile(r".+-seed\d+\.json")  # what a grid writes into <out>/<conf>


def run_config_string(values: dict) -> str:
    """``key=value`` pairs for ``flwr run --run-config`` (strings quoted)."""
    def fmt(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        return f"'{v}'" if isinstance(v, str) else repr(v)
    return " ".join(f"{k}={fmt(v)}" for k, v in values.items())


def parse_overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        out[key] = tomllib.loads(f"v = {raw}")["v"] if raw[:1] not in ("", "'") else raw.strip("'")
    return out


def results_problem(path: Path, num_rounds: int | None) -> str | None:
    """Why a finished run's results file shows it failed; ``None`` when every round trained.

    The paper's ServerApp records each round's aggregated train metrics, ``{}``
    when no client replied with any (every ClientApp raised), and evaluates
    the last round; ``flwr run`` reports such a run as completed all the same.
    """
    if not path.is_file():
        return f"no results file {str(path)!r}"
    try:
        data = json.loads(path.read_text())
        rounds = {int(r): entry if isinstance(entry, dict) else {} for r, entry in data["rounds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"{str(path)!r} is not a readable results file: {err!r}"
    untrained = sorted(r for r, entry in rounds.items() if not entry.get("train"))
    if rounds and len(untrained) == len(rounds):
        return f"no client trained: no round has train metrics ({len(rounds)} rounds recorded)"
    if untrained:
        return f"no client trained in rounds {', '.join(map(str, untrained))}"
    missing = sorted(set(range(1, (num_rounds or 0) + 1)) - set(rounds))
    if not rounds or missing:
        return f"rounds {', '.join(map(str, missing)) or '(all)'} missing from the results"
    last = max(rounds)
    if not rounds[last].get("evaluate"):
        return f"no client evaluated round {last} (the last)"
    return None


def run_one(flower, conf: dict, federation: str, algorithm: str, seed: int, results: Path, timeout: float,
            name: str | None = None) -> None:
    """Run one (algorithm, seed) into ``results``; ``SystemExit`` (non-zero) if it failed.

    Failed: a status other than ``finished:completed``, or a results file
    without train metrics in some round (see :func:`results_problem`); the
    message carries the first error of the run's log (a ClientApp's, when
    the clients failed).
    """
    values = {**conf, "algorithm": algorithm, "seed": seed, "results-path": str(results)}
    start = time.monotonic()
    run_id = flower.run(APP, run_config_string(values), federation)
    tag = f"[{name or results.parent.name} {algorithm} seed {seed}]"
    print(f"{tag} run {run_id} started", flush=True)
    status = flower.wait(run_id, timeout=timeout, progress=lambda s: print(
        f"{tag} {s}, {time.monotonic() - start:.0f}s", flush=True))
    rounds = conf.get("num-server-rounds")
    problem = (f"ended as {status}" if status != "finished:completed"
               else results_problem(results, int(rounds) if rounds is not None else None))
    if problem is not None:
        logs = flower.logs(run_id)
        error = first_error(logs)
        detail = (f"the first error in its log:\n{error}" if error
                  else f"the end of its log:\n{logs[-3000:]}")
        raise SystemExit(f"{tag} run {run_id} failed: {problem}; {detail}")
    print(f"{tag} done in {time.monotonic() - start:.0f}s", flush=True)


def run_one_batched(conf: dict, nodes: int, algorithm: str, seed: int, results: Path, engine: str = "auto",
                    chunk_size: int | None = None, name: str | None = None) -> None:
    """:func:`run_one` on the batched Grid, in this process; ``SystemExit`` (non-zero) if it failed."""
    from batched import run_paper

    values = {**conf, "algorithm": algorithm, "seed": seed, "results-path": str(results)}
    tag = f"[{name or results.parent.name} {algorithm} seed {seed}]"
    start = time.monotonic()
    print(f"{tag} started (batched, {engine})", flush=True)
    error = run_paper(values, nodes, engine, chunk_size)
    rounds = conf.get("num-server-rounds")
    problem = results_problem(results, int(rounds) if rounds is not None else None)
    if problem is not None:
        detail = f"the first client error:\n{error}" if error else "no client raised"
        raise SystemExit(f"{tag} failed: {problem}; {detail}")
    print(f"{tag} done in {time.monotonic() - start:.0f}s", flush=True)


def run_many_batched(tasks: list[dict], jobs: int) -> None:
    """:func:`run_one_batched` for each task (its keyword arguments), ``jobs`` at a time in worker processes.

    Each worker process is fresh (``spawn``): a ClientApp sets process-wide
    torch settings (one thread, deterministic kernels) at import. The first
    failure stops the grid (``SystemExit``) once the running tasks end.
    """
    if jobs <= 1:
        for task in tasks:
            run_one_batched(**task)
        return
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(run_one_batched, **task) for task in tasks]
        for future in concurrent.futures.as_completed(futures):
            if future.exception() is not None:
                for other in futures:
                    other.cancel()
                raise future.exception()  # type: ignore[misc]


def commit(staging: Path, folder: Path) -> None:
    """Replace ``folder``'s results by the finished grid's in ``staging`` (one ``os.replace`` each).

    Results files of ``folder`` that the grid did not write (another
    algorithm or seed of an older grid) are removed, so the table and the
    plot show this grid only. ``staging`` is removed.
    """
    folder.mkdir(parents=True, exist_ok=True)
    new = {p.name for p in staging.iterdir() if RESULTS_NAME.fullmatch(p.name)}
    for name in sorted(new):
        os.replace(staging / name, folder / name)
    for old in sorted(folder.iterdir()):
        if RESULTS_NAME.fullmatch(old.name) and old.name not in new and old.is_file():
            old.unlink()
    shutil.rmtree(staging, ignore_errors=True)


def table(folder: Path) -> str:
    """Mean +- std over seeds per algorithm, and paired differences to FedBN."""
    rows: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        cfg = data["run_config"]
        rows.setdefault(str(cfg["algorithm"]), {})[int(cfg["seed"])] = data["summary"]
    keys = ("acc-after-last", "acc-after-best", "acc-before-last", "acc-before-best")
    lines = [f"{'algorithm':<16}{'seeds':>6}" + "".join(f"{k:>20}" for k in keys)
             + f"{'after-last - fedbn':>22}"]
    base = rows.get("fedbn", {})
    for name, by_seed in sorted(rows.items()):
        cells = []
        for key in keys:
            values = np.array([s[key] for s in by_seed.values() if key in s])
            cells.append(f"{values.mean():.4f} +- {values.std():.4f}" if values.size else "-")
        paired = [by_seed[s]["acc-after-last"] - base[s]["acc-after-last"]
                  for s in by_seed if s in base and name != "fedbn"]
        diff = f"{np.mean(paired):+.4f} (n={len(paired)})" if paired else "-"
        lines.append(f"{name:<16}{len(by_seed):>6}" + "".join(f"{c:>20}" for c in cells) + f"{diff:>22}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("confs", nargs="+", type=Path)
    parser.add_argument("--algorithms", default="fedbn,lips")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config overrides, e.g. num-server-rounds=10")
    parser.add_argument("--cpus-per-client", type=int, default=1)
    parser.add_argument("--gpus-per-client", type=float, default=0.0)
    parser.add_argument("--num-supernodes", type=int, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "paper")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--engine", choices=("flwr", "batched"), default="batched",
                        help="flwr: `flwr run` (Ray); batched: the batched Grid in this process (default)")
    parser.add_argument("--batched-engine", choices=("auto", "sequential", "stacked"), default="auto",
                        help="with --engine batched: clients one after another, or stacked (default: "
                             "stacked on CUDA, else sequential)")
    parser.add_argument("--jobs", type=int, default=1, help="with --engine batched: runs at once")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="with --engine batched: the most clients trained at once")
    args = parser.parse_args()
    # A terminated grid must still stop its SuperLink (the `with` below does on SystemExit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seeds = [int(s) for s in args.seeds.split(",")]
    algorithms = args.algorithms.split(",")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []  # (staging, results folder) per conf
    try:
        with contextlib.ExitStack() as stack:
            flower = None
            if args.engine == "flwr":
                # examples/paper on PYTHONPATH: Ray workers on other machines import the ClientApp from there.
                flower = stack.enter_context(local_flower(out / ".flwr_home", pythonpath=[str(ROOT), str(APP)],
                                                          cwd=ROOT))
            tasks = []
            for conf_path in args.confs:
                conf = tomllib.loads(conf_path.read_text())
                nodes = args.num_supernodes or conf.pop("federation", {}).get("num-supernodes", 10)
                conf.pop("federation", None)
                conf.update(parse_overrides(args.set))
                federation = (f"num-supernodes={nodes} client-resources-num-cpus={args.cpus_per_client} "
                              f"client-resources-num-gpus={args.gpus_per_client}")
                folder = out / conf_path.stem
                staging = Path(tempfile.mkdtemp(prefix=f".{conf_path.stem}.staging-", dir=out))
                staged.append((staging, folder))
                for seed in seeds:
                    for algorithm in algorithms:
                        name = f"{algorithm}-seed{seed}.json"
                        if str(conf.get("resume", "no")).lower() not in ("no", "false") \
                                and (folder / name).is_file():
                            shutil.copy2(folder / name, staging / name)  # a resumed run keeps its rounds
                        if flower is not None:
                            run_one(flower, conf, federation, algorithm, seed, staging / name, args.timeout,
                                    name=conf_path.stem)
                        else:
                            tasks.append(dict(conf=conf, nodes=nodes, algorithm=algorithm, seed=seed,
                                              results=staging / name, engine=args.batched_engine,
                                              chunk_size=args.chunk_size, name=conf_path.stem))
            run_many_batched(tasks, args.jobs)
        for staging, folder in staged:  # every run finished: now, and only now, replace the results
            commit(staging, folder)
    finally:
        for staging, _ in staged:
            shutil.rmtree(staging, ignore_errors=True)
    for _, folder in staged:
        print(f"\n{folder.name}: client-mean test accuracy")
        print(table(folder))
        print(f"plot: {plot_accuracy(folder)}")


if __name__ == "__main__":
    main()
