"""Run the paper app over experiments x algorithms x seeds, then print a table and plot.

    python examples/paper/run_grid.py examples/paper/conf/fashion-mnist-quick.toml \
        --algorithms fedbn,lips --seeds 0

Each conf file is a run config (plus a ``[federation]`` table for
``--federation-config``). Every run writes ``<out>/<conf>/<algorithm>-seed<k>.json``;
the table gives the client-mean test accuracy, mean +- std over seeds, of the
last and the best round, after aggregation (the model clients receive) and
before (the model right after local training), and each algorithm's paired
difference to FedBN on the same seeds.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import plot_accuracy  # noqa: E402

from lips_flwr.experiments.local_flower import local_flower  # noqa: E402

APP = Path(__file__).resolve().parent
ROOT = APP.parents[1]


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


def run_one(flower, conf: dict, federation: str, algorithm: str, seed: int, results: Path, timeout: float):
    values = {**conf, "algorithm": algorithm, "seed": seed, "results-path": str(results)}
    start = time.monotonic()
    run_id = flower.run(APP, run_config_string(values), federation)
    tag = f"[{results.parent.name} {algorithm} seed {seed}]"
    print(f"{tag} run {run_id} started", flush=True)
    status = flower.wait(run_id, timeout=timeout, progress=lambda s: print(
        f"{tag} {s}, {time.monotonic() - start:.0f}s", flush=True))
    if status != "finished:completed":
        print(flower.logs(run_id)[-3000:], file=sys.stderr)
        raise SystemExit(f"{tag} run {run_id} ended as {status}")
    print(f"{tag} done in {time.monotonic() - start:.0f}s", flush=True)


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
    args = parser.parse_args()
    # A terminated grid must still stop its SuperLink (the `with` below does on SystemExit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seeds = [int(s) for s in args.seeds.split(",")]
    algorithms = args.algorithms.split(",")
    out = args.out.resolve()
    folders = []
    # examples/paper on PYTHONPATH: Ray workers on other machines import the ClientApp from there.
    with local_flower(out / ".flwr_home", pythonpath=[str(ROOT), str(APP)], cwd=ROOT) as flower:
        for conf_path in args.confs:
            conf = tomllib.loads(conf_path.read_text())
            nodes = args.num_supernodes or conf.pop("federation", {}).get("num-supernodes", 10)
            conf.pop("federation", None)
            conf.update(parse_overrides(args.set))
            federation = (f"num-supernodes={nodes} client-resources-num-cpus={args.cpus_per_client} "
                          f"client-resources-num-gpus={args.gpus_per_client}")
            folder = out / conf_path.stem
            folder.mkdir(parents=True, exist_ok=True)
            folders.append(folder)
            for seed in seeds:
                for algorithm in algorithms:
                    results = folder / f"{algorithm}-seed{seed}.json"
                    run_one(flower, conf, federation, algorithm, seed, results, args.timeout)
    for folder in folders:
        print(f"\n{folder.name}: client-mean test accuracy")
        print(table(folder))
        print(f"plot: {plot_accuracy(folder)}")


if __name__ == "__main__":
    main()
