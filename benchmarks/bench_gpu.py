"""GPU: Flower Ray simulation throughput of the paper's ResNet8 set-up on one GPU.

Runs the Flower App benchmarks/resnet8-sim (100 clients x 100 random
CIFAR-shaped samples, ResNet8 with 100 classes, 5 local epochs of batch 100,
FedBN + LIPS(FedAvg) with tau0 = 0.7, every client every round, no
evaluation) with ``flwr run`` on a private local SuperLink, once per
``client-resources-num-gpus`` fraction (0.1, 0.25, 0.5: up to 10, 4 and 2
clients on the GPU at once, with one CPU each). Per fraction: rounds per
minute (steady state: the rounds after the first; and overall), the start-up
(``flwr run`` to the end of round 1, incl. Ray, actors, CUDA init), the
largest ``torch.cuda.max_memory_allocated`` of a client, and the GPU memory in
use on the device (``nvidia-smi``, all actors' CUDA contexts included, peak).

    python benchmarks/bench_gpu.py                  # one GPU: 3 fractions x 8 rounds, < 9 minutes
    python benchmarks/bench_gpu.py --smoke          # no GPU: 4 clients, 2 rounds, on the CPU (~1 minute)
    python benchmarks/bench_gpu.py --fractions 0.1,0.2 --rounds 5 --max-run-seconds 150
    python benchmarks/bench_gpu.py --json rows.json  # also write the rows, after each fraction

Each run is cut after ``--max-run-seconds`` (its rounds so far still count).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT, BENCH, code_line, load_line, machine_line, table
from lips_flwr.experiments.local_flower import local_flower

APP = BENCH / "resnet8-sim"


class GpuMemoryPoller:
    """Peak of nvidia-smi's memory.used (MiB, all processes) while it runs."""

    def __init__(self, every: float = 0.5) -> None:
        self.every, self.peak, self.samples = every, 0.0, 0
        self.available = shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=10, check=False).stdout
                self.peak = max([self.peak, *(float(v) for v in out.split())])
                self.samples += 1
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            self._stop.wait(self.every)

    def __enter__(self) -> "GpuMemoryPoller":
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.available:
            self._thread.join(timeout=15)


def accelerator_line() -> str:
    """torch and its CUDA build, and the GPU as nvidia-smi names it (no CUDA context here)."""
    try:
        import torch  # noqa: PLC0415

        line = f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}"
    except ImportError:
        line = "torch not installed"
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False).stdout.strip()
        line += f"; GPU: {out or '?'}"
    else:
        line += "; no nvidia-smi"
    return line


def one_run(flower, out: Path, fraction: float, args) -> dict:
    results = out / f"gpu-{fraction}.json"
    progress = Path(f"{results}.progress")
    results.unlink(missing_ok=True)
    progress.unlink(missing_ok=True)
    run_config = (f"num-server-rounds={args.rounds} local-epochs={args.local_epochs} "
                  f"device='{args.device}' results-path='{results}'")
    federation = (f"num-supernodes={args.clients} client-resources-num-cpus=1 "
                  f"client-resources-num-gpus={fraction}")
    start = time.time()
    with GpuMemoryPoller() as poller:
        run_id = flower.run(APP, run_config, federation)
        while not results.exists() and time.time() - start < args.max_run_seconds:
            time.sleep(0.5)
        finished = results.exists()
        if not finished:
            flower.cli("stop", run_id, timeout=60)
    wall = time.time() - start
    status = flower.wait(run_id, timeout=120) if finished else "stopped (time budget)"
    data = json.loads((results if finished else progress).read_text()) if (
        finished or progress.exists()) else {"round_ends": [], "train_metrics": {}}
    ends = data["round_ends"]
    metrics = data["train_metrics"]
    steady = (len(ends) - 1) / (ends[-1] - ends[0]) * 60 if len(ends) >= 2 else float("nan")
    row = {
        "fraction": fraction, "status": status, "rounds": len(ends), "wall": wall,
        "startup": (ends[0] - start) if ends else float("nan"),
        "steady_rpm": steady,
        "overall_rpm": len(ends) / (ends[-1] - start) * 60 if ends else float("nan"),
        "client_gpu_mb": max((float(m.get("gpu-peak-mb", 0)) for m in metrics.values()), default=0.0),
        "client_s": max((float(m.get("client-seconds", 0)) for m in metrics.values()), default=0.0),
        "on_gpu": min((float(m.get("on-gpu", 0)) for m in metrics.values()), default=0.0),
        "replies": min((int(m.get("replies", 0)) for m in metrics.values()), default=0),
        "device_peak_mb": poller.peak if poller.available else float("nan"),
    }
    print(f"  num-gpus={fraction}: {status}, {row['rounds']} rounds in {wall:.0f}s, "
          f"{steady:.1f} rounds/min after round 1", flush=True)
    if not finished and not ends:
        print(flower.logs(run_id)[-3000:], file=sys.stderr)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="CPU smoke test: 4 clients, 2 rounds, 1 local epoch, num-gpus 0")
    parser.add_argument("--fractions", default="0.1,0.25,0.5")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--max-run-seconds", type=float, default=150)
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the rows here, rewritten after each fraction")
    args = parser.parse_args()
    if args.smoke:
        args.fractions, args.clients, args.rounds = "0", 4, 2
        args.local_epochs, args.device, args.max_run_seconds = 1, "cpu", 300
    print(machine_line())
    print(code_line())
    print(accelerator_line(), flush=True)
    started = time.time()
    rows = []
    with tempfile.TemporaryDirectory(prefix="lips-gpu-") as tmp:
        out = Path(tmp)
        with local_flower(out / "flwr-home", pythonpath=[str(ROOT)], cwd=ROOT) as flower:
            for fraction in (float(f) for f in args.fractions.split(",")):
                rows.append(one_run(flower, out, fraction, args))
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=1))
    print(f"\n{args.clients} clients, ResNet8, {args.local_epochs} local epochs of 100 samples "
          f"(batch 100), device={args.device}")
    print(table([[r["fraction"], r["status"], r["rounds"], f"{r['startup']:.0f}",
                  f"{r['steady_rpm']:.2f}", f"{r['overall_rpm']:.2f}", f"{r['client_s']:.2f}",
                  f"{r['client_gpu_mb']:.0f}", f"{r['device_peak_mb']:.0f}",
                  "yes" if r["on_gpu"] else "no", r["replies"]] for r in rows],
                ["num-gpus", "status", "rounds", "start-up s", "rounds/min (after 1st)",
                 "rounds/min (all)", "slowest client s", "client GPU MB", "device GPU MB",
                 "on GPU", "replies/round"]))
    print(f"\ntotal {time.time() - started:.0f}s; {load_line()}")


if __name__ == "__main__":
    main()
