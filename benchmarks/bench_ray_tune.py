"""Ray core tasks or Ray Tune trials for a sweep's runs: what each costs a run beyond its work (issue 38).

The same 12 runs (each: import ``lips_flwr`` and the batched engine, as a
run's worker does, then sleep ``--work`` seconds), 2 at a time (1 CPU
each), on one local Ray started once, two ways, in a rotating order:

- ``core``: 12 Ray tasks of ``@ray.remote(max_calls=1)`` (a fresh worker
  process per run), as ``lips_flwr.experiments.runner.dispatch`` starts them;
- ``tune``: ``tune.Tuner`` over a 12-value grid, a function trainable of 1
  CPU per trial that reports once (its storage in a temp folder), as a
  sweep on Tune would run them.

Printed: each variant's median wall for the 12 runs and, per run, its
median cost beyond the work: ``(wall - 6 x work) / 12`` (6 rounds of 2 at
a time). Which one the runner uses, and why, is in docs/ray-cluster.md.

    python benchmarks/bench_ray_tune.py              # --work 2 --reps 3
"""

from __future__ import annotations

import one_thread  # noqa: F401  (first: one BLAS thread, set before numpy loads)

import argparse
import logging
import tempfile
import time

from common import code_line, load_line, machine_line, median, table

RUNS, AT_ONCE = 12, 2


def work(seconds: float) -> None:
    import lips_flwr.experiments.batched  # noqa: F401 - what a run's worker imports before its app

    time.sleep(seconds)


def run_core(seconds: float) -> float:
    import ray

    @ray.remote(max_calls=1, max_retries=0, num_cpus=1)
    def task(seconds: float) -> None:
        work(seconds)

    start = time.perf_counter()
    ray.get([task.remote(seconds) for _ in range(RUNS)])
    return time.perf_counter() - start


def run_tune(seconds: float) -> float:
    from ray import tune

    def trainable(config: dict) -> None:
        work(config["seconds"])
        tune.report({"done": 1})

    with tempfile.TemporaryDirectory() as storage:
        tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}),
                           param_space={"seconds": seconds, "seed": tune.grid_search(list(range(RUNS)))},
                           tune_config=tune.TuneConfig(max_concurrent_trials=AT_ONCE, reuse_actors=False),
                           run_config=tune.RunConfig(storage_path=storage, verbose=0))
        start = time.perf_counter()
        results = tuner.fit()
        wall = time.perf_counter() - start
    if results.errors:
        raise SystemExit(f"a trial failed: {results.errors[0]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=float, default=2.0, help="seconds of each run's work")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(machine_line(), flush=True)
    print(code_line(), flush=True)
    import ray

    start = time.perf_counter()
    ray.init(address="local", num_cpus=AT_ONCE, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    print(f"Ray started in {time.perf_counter() - start:.1f} s; {load_line()}", flush=True)
    variants = {"core": run_core, "tune": run_tune}
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for rep in range(args.reps):
            for name in list(variants)[rep % 2:] + list(variants)[:rep % 2]:
                times[name].append(variants[name](args.work))
                print(f"  rep {rep + 1}/{args.reps} {name}: {times[name][-1]:.2f}s", flush=True)
    finally:
        ray.shutdown()
    print(f"  {load_line()}\n")
    floor = RUNS / AT_ONCE * args.work
    rows = [[name, f"{median(walls):.2f}", f"{(median(walls) - floor) / RUNS:.2f}"]
            for name, walls in times.items()]
    print(f"{RUNS} runs of {args.work:g} s, {AT_ONCE} at a time: the work alone is {floor:.1f} s")
    print(table(rows, ["variant", "median wall s", "cost per run s"]))


if __name__ == "__main__":
    main()
