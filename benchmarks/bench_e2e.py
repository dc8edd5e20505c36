"""End to end: wall time of the quickstart app under `flwr run`, LIPS on and off.

Runs examples/quickstart-message (Message API, scikit-learn digits, a small
CNN, ``LIPS(FedAvg)`` with ``fedbn_mod`` and ``lips_mod`` on the clients)
through :func:`lips_flwr.experiments.local_flower.local_flower` (a private SuperLink, stopped
at the end), one run after another on one SuperLink:

- LIPS (``tau0=0.5``, masks after rounds 1 and 6) vs LIPS off (``tau0=0``:
  the same app, identical to the inner FedAvg), 20 clients x 6 rounds, in the
  order off, on, off, on (``--pairs``); the ratio of the medians;
- growth with clients (10, 20, 50 at 6 rounds) and rounds (6 and 12 at 20
  clients), with LIPS on.

Per run: the wall time from ``flwr run`` to the results file (the ServerApp
writes it last), the time to the end of round 1 (start-up: SuperLink, Ray,
actors importing torch), the median duration of the later rounds (from the
``[ROUND k/R]`` lines of the streamed run log), Flower's own ``elapsed``
(ServerApp running time) and the server-side time LIPS spent (the sum of the
``lips-seconds`` metric). Round durations are immune to the start-up's
noise, which dominates wall times on a shared machine.

    python benchmarks/bench_e2e.py            # 7 runs, ~8-10 minutes on 2 cores
    python benchmarks/bench_e2e.py --quick    # 3 runs: off/on at 20 clients, 50 clients
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT, code_line, load_line, machine_line, table
from lips_flwr.experiments.local_flower import local_flower

APP = ROOT / "examples" / "quickstart-message"


class RoundClock:
    """Arrival times of the ``[ROUND k/R]`` lines of ``flwr log <run-id>`` (streamed).

    Flower's log stream arrives in batches (~0.5 s apart), which bounds the
    resolution of a round's duration; it excludes what precedes round 1 and
    the first round's own warm-up (Ray actors importing torch).
    """

    def __init__(self, flower, run_id: str, start: float) -> None:
        exe = Path(sys.executable).with_name("flwr")
        self.start, self.rounds = start, {}
        self.proc = subprocess.Popen(
            [str(exe) if exe.exists() else "flwr", "log", run_id], env=flower.env,
            cwd=flower.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            found = re.search(r"\[ROUND (\d+)/\d+\]", line)
            if found:
                self.rounds.setdefault(int(found.group(1)), time.monotonic() - self.start)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.thread.join(timeout=5)


def one_run(flower, out: Path, name: str, clients: int, rounds: int, tau0: float) -> dict:
    results = out / f"{name}.json"
    results.unlink(missing_ok=True)
    run_config = (f"num-server-rounds={rounds} tau0={tau0} every=5 local-epochs=2 "
                  f"results-path='{results}'")
    federation = f"num-supernodes={clients} client-resources-num-cpus=1"
    start = time.monotonic()
    run_id = flower.run(APP, run_config, federation)
    clock = RoundClock(flower, run_id, start)
    try:
        while not results.exists():  # a stat per 0.2 s: no load from polling `flwr ls`
            if time.monotonic() - start > 900:
                raise TimeoutError(f"{name}: no results after 900 s\n{flower.logs(run_id)[-3000:]}")
            time.sleep(0.2)
        wall = time.monotonic() - start
    finally:
        clock.stop()
    # Round k runs from its [ROUND k/R] line to the next one (the last: to the results).
    marks = [clock.rounds.get(k) for k in range(1, rounds + 1)] + [wall]
    durations = [b - a for a, b in zip(marks, marks[1:]) if a is not None and b is not None]
    status = flower.wait(run_id, timeout=120)
    if status != "finished:completed":
        print(flower.logs(run_id)[-3000:], file=sys.stderr)
        raise SystemExit(f"{name}: run {run_id} ended as {status}")
    listing = flower.cli("ls", "--run-id", run_id, "--format", "json").stdout
    info = json.loads(listing[listing.index("{"):])["runs"][0]
    metrics = json.loads(results.read_text())["train_metrics"]
    lips = sum(float(m.get("lips-seconds", 0.0)) for m in metrics.values())
    masks = sorted(int(r) for r, m in metrics.items() if m.get("lips-mask-round"))
    steady = durations[1:]  # round 1 carries the actors' warm-up
    row = {"name": name, "clients": clients, "rounds": rounds, "tau0": tau0, "wall": wall,
           "elapsed": float(info.get("elapsed", float("nan"))), "lips": lips, "masks": masks,
           "first": marks[1] if marks[1] is not None else float("nan"),
           "round": statistics.median(steady) if steady else float("nan")}
    print(f"  {name}: {clients} clients x {rounds} rounds, tau0={tau0}: wall {wall:.1f}s, "
          f"to end of round 1 {row['first']:.1f}s, median later round {row['round']:.2f}s, "
          f"LIPS {lips * 1e3:.0f} ms, masks {masks}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="off/on pairs at 20 clients")
    parser.add_argument("--quick", action="store_true", help="one pair and the 50-client run")
    args = parser.parse_args()
    pairs = 1 if args.quick else args.pairs
    print(machine_line())
    print(code_line(), flush=True)
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="lips-e2e-") as tmp:
        out = Path(tmp)
        with local_flower(out / "flwr-home", pythonpath=[str(ROOT)], cwd=ROOT) as flower:
            for i in range(pairs):
                rows.append(one_run(flower, out, f"off-{i}", 20, 6, 0.0))
                rows.append(one_run(flower, out, f"on-{i}", 20, 6, 0.5))
            if not args.quick:
                rows.append(one_run(flower, out, "on-10c", 10, 6, 0.5))
                rows.append(one_run(flower, out, "on-12r", 20, 12, 0.5))
            rows.append(one_run(flower, out, "on-50c", 50, 6, 0.5))

    off = [r for r in rows if r["name"].startswith("off-")]
    on = [r for r in rows if r["name"].startswith("on-") and r["name"][3:].isdigit()]
    print("\nEvery run. wall: flwr run -> results file; round 1: flwr run -> end of round 1 "
          "(SuperLink, Ray, actors, first round); later rounds: median duration of rounds 2..R "
          "(train + evaluate of every client); ServerApp: Flower's elapsed; LIPS: server-side "
          "lips-seconds summed over the rounds")
    print(table([[r["name"], r["clients"], r["rounds"], r["tau0"], f"{r['wall']:.1f}",
                  f"{r['first']:.1f}", f"{r['round']:.2f}", f"{r['elapsed']:.1f}",
                  f"{r['lips'] * 1e3:.0f} ms", ",".join(map(str, r["masks"])) or "-"] for r in rows],
                ["run", "clients", "rounds", "tau0", "wall s", "round 1 ends s", "later rounds s",
                 "ServerApp s", "LIPS", "masks"]))
    for key, label in (("wall", "wall"), ("round", "later rounds")):
        ratio = statistics.median(r[key] for r in on) / statistics.median(r[key] for r in off)
        print(f"LIPS on / off, 20 clients x 6 rounds, median {label}: {ratio:.3f}")
    by_clients = {r["clients"]: r for r in rows if r["name"] in ("on-10c", "on-50c")}
    by_clients[20] = min(on, key=lambda r: abs(r["round"] - statistics.median(x["round"] for x in on)))
    print("By clients (6 rounds, LIPS on): " + "; ".join(
        f"{c}: wall {r['wall']:.0f}s, later rounds {r['round']:.2f}s ({r['round'] / c * 1e3:.0f} ms/client)"
        for c, r in sorted(by_clients.items())))
    more = [r for r in rows if r["name"] == "on-12r"]
    if more:
        per = (more[0]["wall"] - statistics.median(r["wall"] for r in on)) / 6
        print(f"By rounds (20 clients, LIPS on): 6 rounds {statistics.median(r['wall'] for r in on):.0f}s, "
              f"12 rounds {more[0]['wall']:.0f}s of wall: {per:.2f}s per extra round")
    print(f"\ntotal {time.perf_counter() - started:.0f}s; {load_line()}")


if __name__ == "__main__":
    main()
