"""The main job: FedBN vs LIPS with `flwr run` on offline data, then a results table.

Runs the Message API quickstart app (scikit-learn digits, Dirichlet low-data
split, FedBN via ``fedbn_mod``) twice with the same seed: ``tau0=0`` (LIPS
off, i.e. plain FedBN) and ``tau0=0.5``. Each run writes a JSON results file
under ``results/quickstart/``; the table gives the client-mean test accuracy
of the last and the best round.

    python examples/run_quickstart.py [--rounds 30] [--clients 20] [--alpha 0.1] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lips_flwr.local_run import local_flower

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "quickstart-message"


def run_one(flower, name: str, tau0: float, args, out_dir: Path) -> dict:
    results = out_dir / f"{name}.json"
    results.unlink(missing_ok=True)
    run_config = (
        f"num-server-rounds={args.rounds} every={args.every} tau0={tau0} "
        f"seed={args.seed} alpha={args.alpha} results-path='{results}'"
    )
    federation = f"num-supernodes={args.clients} client-resources-num-cpus=1"
    start = time.monotonic()
    run_id = flower.run(APP, run_config, federation)
    print(f"[{name}] run {run_id} started ({args.rounds} rounds, {args.clients} clients)", flush=True)
    status = flower.wait(run_id, timeout=args.timeout, progress=lambda s: print(
        f"[{name}] {s} after {time.monotonic() - start:.0f}s", flush=True))
    if status != "finished:completed":
        print(flower.logs(run_id)[-3000:], file=sys.stderr)
        raise SystemExit(f"[{name}] run {run_id} ended as {status}")
    data = json.loads(results.read_text())
    accuracy = [m["eval-acc"] for _, m in sorted(data["evaluate_metrics"].items(), key=lambda kv: int(kv[0]))]
    masks = [int(r) for r, m in data["train_metrics"].items() if m.get("lips-mask-round") and tau0 > 0]
    return {
        "name": name,
        "last": accuracy[-1],
        "best": max(accuracy),
        "masks": sorted(masks),
        "seconds": time.monotonic() - start,
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "quickstart")
    args = parser.parse_args()
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    rows = []
    with local_flower(out_dir / ".flwr_home", pythonpath=[str(ROOT)], cwd=ROOT) as flower:
        for name, tau0 in (("fedbn", 0.0), ("lips", 0.5)):
            rows.append(run_one(flower, name, tau0, args, out_dir))

    print()
    print(f"digits, {args.clients} clients x 100 samples, Dir({args.alpha}), "
          f"{args.rounds} rounds, seed {args.seed}: client-mean test accuracy")
    print(f"{'algorithm':<10} {'last':>7} {'best':>7} {'mask rounds':<16} {'time':>6}")
    for row in rows:
        masks = ",".join(map(str, row["masks"])) or "-"
        print(f"{row['name']:<10} {row['last']:>7.3f} {row['best']:>7.3f} {masks:<16} "
              f"{row['seconds']:>5.0f}s")
    print(f"results: {', '.join(str(r['results']) for r in rows)}")
    print("One seed on a small task: see the paper app (examples issue) for paired multi-seed runs.")


if __name__ == "__main__":
    main()
