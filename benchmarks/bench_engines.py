"""Engines side by side: ``flwr run`` vs the batched Grid vs the compute floor, on the paper app.

The paper app (``examples/paper``: FedBN + LIPS, the ServerApp that writes a
results JSON) run three ways in one invocation, one run after another, the
order rotating every repetition (``--reps``):

- ``flwr``: ``flwr run`` on a private local SuperLink
  (:func:`~lips_flwr.experiments.local_flower.local_flower`, a fresh Flower
  home per run, so the SuperLink's start-up is included), Ray simulation,
  1 CPU per client (as many clients at once as the machine has cores);
- ``batched``: the paper app's ServerApp and ClientApp on
  :func:`~lips_flwr.experiments.batched.run_batched` with
  ``engine="sequential"`` (``--gpu``: ``"stacked"`` and ``"auto"``) in a
  fresh Python process (``python benchmarks/bench_engines.py --child ...``:
  start-up and imports included);
- ``floor``: the same clients' work in one fresh process, one client after
  another, without Flower: per round, for each client, the global state
  loaded into one reused model, ``train_tensors`` with the ClientApp's
  settings and seeds, its test set evaluated (acc-before); the states
  averaged (plain mean); each client evaluated on the mean (acc-after).

Measured: end-to-end wall (``flwr``: from calling ``flwr run`` to the
run's ``finished-at`` in ``flwr ls``; the others: the child process from
start to exit), the wall of rounds 2..R (round 1 includes the warm-up:
workers, data, first kernels) from the results JSON's per-round
``seconds`` (``floor``: its own clock), and the peak memory (``batched``,
``floor``: the child's peak RSS from ``os.wait4``; ``flwr``: the largest sum
of RSS, and of PSS, over the SuperLink's process tree, sampled every 0.5 s).
Inside the batched run, a round is split into client compute (time inside
``local_compute().train/.evaluate``; stacked: the Rendezvous leader's
gathered calls), client overhead (the rest of the clients' calls: model
build, state-dict load, record conversion, mods) and the server step (the
round minus the clients' calls).

    python benchmarks/bench_engines.py --reps 2         # 20 FashionCNN clients, 5 rounds (~5 min on 2 cores)
    python benchmarks/bench_engines.py --clients 100 --rounds 3
    python benchmarks/bench_engines.py --quick          # 2 clients, 2 rounds, tiny samples
    python benchmarks/bench_engines.py --gpu            # 100 ResNet8 clients, stacked/auto vs floor, FLOPs
    python benchmarks/bench_engines.py --gpu --quick    # the same at a CPU-sized toy scale

``--gpu`` trains on synthetic CIFAR-100-shaped data (3x32x32 uint8, 100
classes; no CIFAR is available offline): the benchmark replaces the
ClientApp's ``load_dataset`` in its own child processes only. ``flwr run``'s
Ray workers cannot see that data, so ``--gpu`` compares the batched engines
with the floor only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "paper"


def run_config(values: dict) -> dict:
    """The paper app's run config for ``values``, as ``flwr run`` resolves it (its defaults fused)."""
    from lips_flwr.experiments.runner.apps import load_app, resolve_run_config

    return resolve_run_config(load_app(APP), values)
CONF = APP / "conf" / "fashion-mnist-quick.toml"
for _path in (str(ROOT), str(APP)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from common import rotated  # noqa: E402 - (benchmarks/, the script's folder, is on sys.path)

SYNTHETIC = "cifar100"  # --gpu: the dataset name whose data are generated (ResNet8 with 100 classes)


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


# ----- the workloads -----------------------------------------------------------------------------

def workload(args) -> dict:
    """Run-config values, number of nodes, engines, and whether the data are synthetic."""
    if args.gpu:
        values = {"dataset": SYNTHETIC, "model": "resnet8", "samples-per-client": 100, "test-samples": 100,
                  "alpha": 0.1, "local-epochs": 5, "batch-size": 100, "lr": 0.1, "eval-every": 1}
        clients = args.clients or 100
        if args.quick:
            values.update({"samples-per-client": 20, "test-samples": 20, "local-epochs": 1, "batch-size": 10})
            clients = args.clients or 3
        engines = args.engines or "stacked,auto,floor"
    else:
        values = tomllib.loads(CONF.read_text())
        values.pop("federation", None)
        clients = args.clients or 20
        if args.quick:
            values.update({"samples-per-client": 20, "test-samples": 20})
            clients = args.clients or 2
        engines = args.engines or "flwr,sequential,floor"
    rounds = args.rounds or (2 if args.quick else 5)
    values.update({"num-server-rounds": rounds, "algorithm": "lips", "seed": 0, "device": args.device})
    return {"values": values, "nodes": clients, "engines": engines.split(","), "synthetic": args.gpu,
            "rounds": rounds}


def synthetic_dataset():
    """CIFAR-100-shaped random images (uint8, 3x32x32), 100 per class for training, 20 for testing."""
    import numpy as np

    from lips_flwr.experiments.task.data import ImageDataset

    rng = np.random.default_rng(20240601)
    classes, n_train, n_test = 100, 10_000, 2_000
    y_train = rng.permutation(np.arange(n_train) % classes)
    y_test = rng.permutation(np.arange(n_test) % classes)
    x_train = rng.integers(0, 256, (n_train, 3, 32, 32), dtype=np.uint8)
    x_test = rng.integers(0, 256, (n_test, 3, 32, 32), dtype=np.uint8)
    return ImageDataset(SYNTHETIC, x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64),
                        classes, (0.5, 0.5, 0.5), (0.289, 0.289, 0.289))


def loader(synthetic: bool):
    """``load_dataset``, or one that gives :func:`synthetic_dataset` for ``SYNTHETIC``."""
    from lips_flwr.experiments.task.data import load_dataset

    if not synthetic:
        return load_dataset
    data = synthetic_dataset()
    def load(name: str, path: str | None = None, seed: int = 0):
        return data if name == SYNTHETIC else load_dataset(name, path, seed)
    return load


# ----- child processes: the batched engine and the floor --------------------------------------------

class TimedCompute:
    """A ``LocalCompute`` that logs ``(kind, start, seconds)`` of every call of ``inner``."""

    def __init__(self, inner, log: list) -> None:
        self.inner, self.log = inner, log

    def train(self, net, x, y, **kwargs):
        start = time.perf_counter()
        try:
            return self.inner.train(net, x, y, **kwargs)
        finally:
            self.log.append(("train", start, time.perf_counter() - start))

    def evaluate(self, net, x, y):
        start = time.perf_counter()
        try:
            return self.inner.evaluate(net, x, y)
        finally:
            self.log.append(("evaluate", start, time.perf_counter() - start))


def child_batched(spec: dict) -> dict:
    """One run of the paper app on the batched Grid, its rounds' events logged."""
    import lips_paper.client_app as client_app
    import lips_paper.server_app as server_app
    import torch

    from lips_flwr.experiments.task import training
    from lips_flwr.experiments.batched import grid as batched_grid
    from lips_flwr.experiments.batched import rendezvous, run_batched

    client_app.load_dataset = loader(spec["synthetic"])  # the ClientApp looks it up per call
    events: dict[str, list] = {"save": [], "deliver": [], "compute": []}

    save = server_app.RecordingLIPS._save

    def timed_save(self, server_round, part, metrics):
        save(self, server_round, part, metrics)
        events["save"].append((int(server_round), part, time.perf_counter()))

    deliver = batched_grid.BatchedGrid._deliver

    def timed_deliver(self, *args, **kwargs):  # the Grid's own signature, whatever it is
        start = time.perf_counter()
        had = bool(self._pending)
        deliver(self, *args, **kwargs)
        if had:
            events["deliver"].append(("clients", start, time.perf_counter() - start))

    execute = rendezvous.Rendezvous._execute

    def timed_execute(self, calls):
        start = time.perf_counter()
        try:
            execute(self, calls)
        finally:
            events["compute"].append((calls[0].kind if calls else "-", start, time.perf_counter() - start))

    server_app.RecordingLIPS._save = timed_save
    batched_grid.BatchedGrid._deliver = timed_deliver
    rendezvous.Rendezvous._execute = timed_execute
    # sequential: the clients call local_compute() in this thread; stacked: each client thread
    # gets the Rendezvous (whose leader is timed above) instead of this.
    with training.computing_with(TimedCompute(training.SEQUENTIAL, events["compute"])):
        error = run_batched(server_app.app, client_app.app, run_config=run_config(spec["values"]),
                            num_nodes=spec["nodes"], engine=spec["engine"],
                            chunk_size=spec.get("chunk_size")).first_error
    out = {"events": events, "error": error,
           "results": json.loads(Path(spec["values"]["results-path"]).read_text())}
    if torch.cuda.is_available():
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out["device_name"] = torch.cuda.get_device_name()
    return out


def child_floor(spec: dict) -> dict:
    """The clients' work with no Flower: one reused model, one client after another, plain mean."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    from lips_flwr.experiments.task.data import DATASET_INFO, client_split
    from lips_flwr.experiments.task.models import build_model
    from lips_flwr.experiments.task.training import evaluate_tensors, train_tensors

    # The ClientApp's process-wide settings.
    torch.set_num_threads(1)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    cfg = run_config(spec["values"])
    if cfg["algorithm"] != "lips" or float(cfg["val-fraction"]) != 0.0:
        raise ValueError("the floor reproduces the ClientApp for algorithm 'lips' without a validation split")
    wanted = str(cfg["device"])
    device = torch.device("cuda" if wanted == "auto" and torch.cuda.is_available() else
                          "cpu" if wanted == "auto" else wanted)
    nodes, rounds, seed = spec["nodes"], int(cfg["num-server-rounds"]), int(cfg["seed"])
    data = loader(spec["synthetic"])(str(cfg["dataset"]), str(cfg["dataset-path"]) or None, seed)
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)

    def prep(a):
        return ((torch.from_numpy(a).float() / 255 - mean) / std).to(device)

    clients = []
    for pid in range(nodes):  # as client_tensors does, once per process (not timed per round)
        x, y, xt, yt = client_split(data, pid, int(cfg["samples-per-client"]), int(cfg["test-samples"]),
                                    float(cfg["alpha"]), seed)
        clients.append((prep(x), torch.from_numpy(y).to(device), prep(xt), torch.from_numpy(yt).to(device)))
    num_classes, channels = DATASET_INFO[str(cfg["dataset"])]
    torch.manual_seed(seed)  # the ServerApp's initial model
    net = build_model(str(cfg["model"]), num_classes, channels).to(device)
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    fit = dict(epochs=int(cfg["local-epochs"]), lr=float(cfg["lr"]), momentum=float(cfg["momentum"]),
               batch_size=int(cfg["batch-size"]), augmentation=str(cfg["augment"]), weight_decay=0.0,
               decay_only=None)
    walls, acc_before, acc_after = [], [], []
    for rnd in range(1, rounds + 1):
        start = time.perf_counter()
        total = {k: torch.zeros_like(v, dtype=torch.float64 if not v.is_floating_point() else v.dtype)
                 for k, v in state.items()}
        before = []
        for pid, (x, y, xt, yt) in enumerate(clients):
            net.load_state_dict(state)
            client_seed = (seed * 1_000_003 + rnd) * 1009 + pid
            torch.manual_seed(client_seed)
            train_tensors(net, x, y, seed=client_seed, **fit)
            before.append(evaluate_tensors(net, xt, yt)[1])
            for k, v in net.state_dict().items():
                total[k] += v
        state = {k: (total[k] / nodes).to(v.dtype) for k, v in state.items()}
        after = []
        for _, _, xt, yt in clients:
            net.load_state_dict(state)
            after.append(evaluate_tensors(net, xt, yt)[1])
        if device.type == "cuda":
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
        acc_before.append(sum(before) / nodes)
        acc_after.append(sum(after) / nodes)
    out = {"rounds": walls, "acc_before": acc_before, "acc_after": acc_after}
    if device.type == "cuda":
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out["device_name"] = torch.cuda.get_device_name()
    return out


def child_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    out = child_batched(spec) if spec["kind"] == "batched" else child_floor(spec)
    Path(spec["out"]).write_text(json.dumps(out))


# ----- the parent: running and measuring --------------------------------------------------------------

def round_walls(results: dict) -> dict[int, float]:
    """Round -> its wall seconds, from the ServerApp's cumulative per-round ``seconds``."""
    seconds = {int(r): float(v["seconds"]) for r, v in results["rounds"].items()}
    return {r: seconds[r] - seconds.get(r - 1, 0.0) for r in sorted(seconds)}


def run_child(kind: str, w: dict, tmp: Path, tag: str, engine: str | None = None,
              chunk_size: int | None = None, timeout: float = 3600) -> dict:
    """A fresh Python process running :func:`child_batched` or :func:`child_floor`; wall and peak RSS."""
    values = {**w["values"], "results-path": str(tmp / f"{tag}.json")}
    spec = {"kind": kind, "values": values, "nodes": w["nodes"], "engine": engine, "chunk_size": chunk_size,
            "synthetic": w["synthetic"], "out": str(tmp / f"{tag}.out.json")}
    spec_path = tmp / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    log_path = tmp / f"{tag}.log"
    with open(log_path, "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        watchdog = threading.Timer(timeout, lambda: proc.kill())
        watchdog.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        watchdog.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    if proc.returncode != 0:
        raise SystemExit(f"{tag} exited {proc.returncode}; the end of its log:\n"
                         f"{log_path.read_text()[-4000:]}")
    out = json.loads(Path(spec["out"]).read_text())
    out.update(e2e=wall, peak_rss_mb=usage.ru_maxrss / 1024)  # Linux: KiB
    if kind == "batched":
        if out.get("error"):
            print(f"  {tag}: a client failed: {out['error'][:2000]}")
        walls = round_walls(out["results"])
        out["rounds"] = [walls[r] for r in sorted(walls)]
        out["breakdown"] = breakdown(out["events"])
        out["acc_after"] = [out["results"]["rounds"][str(r)].get("evaluate", {}).get("acc-after")
                            for r in sorted(walls)]
    return out


def breakdown(events: dict) -> list[dict]:
    """Per round 2..R: wall, clients' calls, compute inside them, overhead, server step (seconds)."""
    ends: dict[int, float] = {}
    for rnd, _, t in events["save"]:
        ends[rnd] = max(ends.get(rnd, t), t)
    rows = []
    for rnd in sorted(ends):
        if rnd - 1 not in ends:
            continue
        lo, hi = ends[rnd - 1], ends[rnd]
        def inside(log, lo=lo, hi=hi):
            return sum(d for _, s, d in log if lo < s + d <= hi)
        wall, clients, compute = hi - lo, inside(events["deliver"]), inside(events["compute"])
        rows.append({"round": rnd, "wall": wall, "clients": clients, "compute": compute,
                     "overhead": clients - compute, "server": wall - clients})
    return rows


class TreeSampler(threading.Thread):
    """Every ``every`` s: the summed RSS (and PSS) of the SuperLink of ``log_file`` and its process tree."""

    def __init__(self, log_file: Path, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.log_file, self.every = log_file, every
        self.peak_rss = self.peak_pss = 0.0
        self.peak_procs = 0
        self._halt = threading.Event()

    @staticmethod
    def _kb(path: str, key: str) -> float:
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return float(line.split()[1])
        except OSError:
            pass
        return 0.0

    def run(self) -> None:
        from lips_flwr.experiments.local_flower import _tree, find_superlinks

        roots: list[int] = []
        while not self._halt.wait(self.every):
            if not roots:
                roots = find_superlinks(self.log_file)
                if not roots:
                    continue
            procs = _tree(roots)
            rss = sum(self._kb(f"/proc/{p}/status", "VmRSS:") for p in procs) / 1024
            pss = sum(self._kb(f"/proc/{p}/smaps_rollup", "Pss:") for p in procs) / 1024
            if rss > self.peak_rss:
                self.peak_rss, self.peak_procs = rss, len(procs)
            self.peak_pss = max(self.peak_pss, pss)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_flwr(w: dict, tmp: Path, tag: str, timeout: float) -> dict:
    """One ``flwr run`` on a fresh local SuperLink; end-to-end wall, round walls, peak tree memory."""
    from lips_flwr.experiments.runner.flwr_runs import run_config_string
    from lips_flwr.experiments.local_flower import first_error, local_flower

    results = tmp / f"{tag}.json"
    values = {**w["values"], "results-path": str(results)}
    rounds = w["rounds"]
    federation = f"num-supernodes={w['nodes']} client-resources-num-cpus=1 client-resources-num-gpus=0.0"
    with local_flower(tmp / f"{tag}.flwr_home", pythonpath=[str(ROOT), str(APP)], cwd=ROOT) as flower:
        sampler = TreeSampler(flower.log_file)
        sampler.start()
        start = time.time()
        run_id = flower.run(APP, run_config_string(values), federation)
        deadline, next_status, status = time.monotonic() + timeout, time.monotonic() + 30, "unknown"
        while time.monotonic() < deadline:  # the results file first: `flwr ls` costs a CLI start-up
            time.sleep(0.5)
            with contextlib.suppress(OSError, ValueError, KeyError):
                if "evaluate" in json.loads(results.read_text())["rounds"].get(str(rounds), {}):
                    break
            if time.monotonic() >= next_status:
                status = flower.status(run_id)
                if status.startswith("finished"):
                    break
                next_status = time.monotonic() + 30
        while time.monotonic() < deadline and not status.startswith("finished"):
            status = flower.status(run_id)
        sampler.stop()
        if status != "finished:completed":
            raise SystemExit(f"{tag}: run {run_id} ended as {status}: {first_error(flower.logs(run_id))}")
        proc = flower.cli("ls", "--run-id", run_id, "--format", "json", timeout=60)
        info = json.loads(proc.stdout[proc.stdout.index("{"):])["runs"][0]
    finished = datetime.fromisoformat(info["finished-at"].replace(" ", "T")).timestamp()
    data = json.loads(results.read_text())
    walls = round_walls(data)
    return {"e2e": finished - start, "rounds": [walls[r] for r in sorted(walls)],
            "peak_rss_mb": sampler.peak_rss, "peak_pss_mb": sampler.peak_pss, "procs": sampler.peak_procs,
            "acc_after": [data["rounds"][str(r)].get("evaluate", {}).get("acc-after") for r in sorted(walls)]}


def run_engine(name: str, w: dict, tmp: Path, tag: str, args) -> dict:
    if name == "flwr":
        return run_flwr(w, tmp, tag, args.timeout)
    if name == "floor":
        return run_child("floor", w, tmp, tag, timeout=args.timeout)
    return run_child("batched", w, tmp, tag, engine=name, chunk_size=args.chunk_size, timeout=args.timeout)


# ----- FLOPs (--gpu) ---------------------------------------------------------------------------------

def flops_per_round(w: dict) -> dict:
    """Training and evaluation FLOPs of one round (``FlopCounterMode``: convolutions and matmuls)."""
    import torch
    from torch.nn import functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from lips_flwr.experiments.task.data import DATASET_INFO
    from lips_flwr.experiments.task.models import build_model

    cfg = run_config(w["values"])
    classes, channels = DATASET_INFO[str(cfg["dataset"])]
    side = 32 if channels == 3 else 28
    batch, samples, test = int(cfg["batch-size"]), int(cfg["samples-per-client"]), int(cfg["test-samples"])
    net = build_model(str(cfg["model"]), classes, channels)
    x, y = torch.randn(batch, channels, side, side), torch.randint(0, classes, (batch,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(net(x), y).backward()
    step = counter.get_total_flops()
    net.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        net(torch.randn(test, channels, side, side))
    evaluate = counter.get_total_flops()
    epochs = int(cfg["local-epochs"])
    steps = epochs * math.ceil(samples / batch)
    train = epochs * samples * step / batch  # a last, smaller batch costs its share
    per_client = train + 2 * evaluate  # acc-before on the trained model, acc-after on the received one
    return {"step": step, "steps": steps, "evaluate": evaluate, "per_client": per_client,
            "round": per_client * w["nodes"], "train_round": train * w["nodes"]}


# ----- the report -------------------------------------------------------------------------------------

def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(w: dict, runs: dict[str, list[dict]], args) -> dict:
    summary: dict[str, dict] = {}
    for name, reps in runs.items():
        later = [s for rep in reps for s in rep["rounds"][1:]]  # rounds 2..R of every repetition
        row = {"e2e": med([r["e2e"] for r in reps]), "round": med(later),
               "outside": med([r["e2e"] - sum(r["rounds"][1:]) for r in reps]),
               "peak_rss_mb": max(r["peak_rss_mb"] for r in reps)}
        if "peak_pss_mb" in reps[0]:
            row["peak_pss_mb"] = max(r["peak_pss_mb"] for r in reps)
            row["procs"] = max(r["procs"] for r in reps)
        if "cuda_peak_mb" in reps[0]:
            row["cuda_peak_mb"] = max(r["cuda_peak_mb"] for r in reps)
        if "breakdown" in reps[0]:
            parts = [b for r in reps for b in r["breakdown"]]
            row["breakdown"] = {k: statistics.fmean(b[k] for b in parts)
                                for k in ("wall", "clients", "compute", "overhead", "server")}
        row["acc_after_last"] = reps[0]["acc_after"][-1]
        summary[name] = row
    flwr, floor = summary.get("flwr"), summary.get("floor")
    label = {"flwr": "flwr run (Ray)", "floor": "compute floor"}
    print(f"\n{w['nodes']} clients x {w['rounds']} rounds, {len(next(iter(runs.values())))} repetition(s); "
          f"load average now {load()} (1, 5, 15 min)")
    print("| engine | end-to-end s | round s (median, rounds 2..R) | outside rounds 2..R s | "
          "e2e / flwr run | round / flwr run | round / floor | peak memory MB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in summary.items():
        ratio = lambda a, b: f"{a / b:.2f}" if b else "-"  # noqa: E731
        memory = f"{row['peak_rss_mb']:.0f} RSS"
        if "peak_pss_mb" in row:
            memory = (f"{row['peak_rss_mb']:.0f} RSS sum / {row['peak_pss_mb']:.0f} PSS sum "
                      f"({row['procs']} procs)")
        if "cuda_peak_mb" in row:
            memory += f", {row['cuda_peak_mb']:.0f} CUDA"
        print(f"| {label.get(name, f'batched ({name})')} | {row['e2e']:.1f} | {row['round']:.3f} | "
              f"{row['outside']:.1f} | {ratio(row['e2e'], flwr['e2e']) if flwr else '-'} | "
              f"{ratio(row['round'], flwr['round']) if flwr else '-'} | "
              f"{ratio(row['round'], floor['round']) if floor else '-'} | {memory} |")
    accs = ", ".join(f"{n} {r['acc_after_last']:.4f}" for n, r in summary.items()
                     if r["acc_after_last"] is not None)
    print(f"\nacc-after of the last round (a check that every engine trained): {accs}")
    for name, row in summary.items():
        if "breakdown" not in row:
            continue
        b = row["breakdown"]
        print(f"\nWhere a batched ({name}) round goes (mean over rounds 2..R, so the parts add up):")
        print("| part | s | share |")
        print("|---|---|---|")
        for key, text in (("compute", "client compute (inside local_compute)"),
                          ("overhead", "client overhead (the rest of the client calls)"),
                          ("server", "server step (round minus client calls)"), ("wall", "round")):
            print(f"| {text} | {b[key]:.3f} | {b[key] / b['wall']:.0%} |")
        if flwr and name == "sequential":
            workers = min(w["nodes"], os.cpu_count() or 1)
            rest = flwr["round"] - b["clients"] / workers - b["server"]
            print(f"\nflwr run round {flwr['round']:.3f} s = clients' calls {b['clients']:.3f} s / {workers} "
                  f"workers ({b['clients'] / workers:.3f}) + server step {b['server']:.3f} + "
                  f"Flower/Ray messaging and scheduling {rest:.3f} s ({rest / flwr['round']:.0%})")
            print("  (assumed: a Ray worker spends on a client call what the batched process does, the "
                  f"{workers} workers share the clients evenly and in parallel, and the server step is the "
                  "batched one; on a machine shared with other work this charges any slowdown of the "
                  "workers to messaging)")
            row["flwr_messaging"] = rest
    if "flops" in w:
        f = w["flops"]
        print(f"\nFLOPs (torch FlopCounterMode: convolutions and matmuls): one training step "
              f"{f['step'] / 1e9:.3f} GFLOP x {f['steps']} steps, one test evaluation "
              f"{f['evaluate'] / 1e9:.3f} GFLOP x 2, per client {f['per_client'] / 1e9:.2f} GFLOP; "
              f"per round {f['round'] / 1e12:.3f} TFLOP")
        print("| engine | round s | achieved TFLOP/s (round) | TFLOP/s in client compute |")
        print("|---|---|---|---|")
        for name, row in summary.items():
            compute = row.get("breakdown", {}).get("compute")
            in_compute = f"{f['round'] / compute / 1e12:.3f}" if compute else "-"
            print(f"| {label.get(name, f'batched ({name})')} | {row['round']:.3f} | "
                  f"{f['round'] / row['round'] / 1e12:.3f} | {in_compute} |")
    targets, paired = {}, {}
    for name in summary:
        if name in ("flwr", "floor"):
            continue
        for base, text, num, den, key in (
                ("flwr", f"{name}: flwr run / batched, end-to-end (target >= 1.3)", "flwr", name, "e2e"),
                ("floor", f"{name}: batched / floor, round (target <= 1.15)", name, "floor", "round")):
            if base not in summary:
                continue
            targets[text] = summary[num][key] / summary[den][key]
            # the same ratio within each repetition (the runs of one repetition ran back to back)
            def per_rep(r, key=key):
                return r["e2e"] if key == "e2e" else med(r["rounds"][1:])
            paired[text] = [per_rep(a) / per_rep(b) for a, b in zip(runs[num], runs[den])]
    if targets:
        print()
    for text, value in targets.items():
        target_met = value >= 1.3 if ">=" in text else value <= 1.15
        reps = ", ".join(f"{v:.2f}" for v in paired[text])
        print(f"{text}: {value:.2f} (per repetition: {reps}) -> {'met' if target_met else 'NOT met'}")
    return {"summary": summary, "targets": targets, "paired": paired}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=None, help="default 20 (--gpu: 100)")
    parser.add_argument("--rounds", type=int, default=None, help="default 5")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of every engine, order rotating")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke-sized run (seconds of work, plus start-ups)")
    parser.add_argument("--gpu", action="store_true",
                        help="ResNet8 x 100 synthetic CIFAR-100-shaped samples, 5 local epochs; "
                             "batched stacked/auto vs the floor, with FLOPs")
    parser.add_argument("--engines", default=None,
                        help="comma-separated of flwr, sequential, stacked, auto, floor "
                             "(default: flwr,sequential,floor; --gpu: stacked,auto,floor)")
    parser.add_argument("--device", default="auto", help="the run config's `device` (auto: cuda if present)")
    parser.add_argument("--chunk-size", type=int, default=None, help="stacked: the most clients at once")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child)
        return
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    w = workload(args)
    if w["synthetic"] and "flwr" in w["engines"]:
        raise SystemExit("--gpu trains on synthetic data that `flwr run`'s workers cannot see: drop `flwr`")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load()} (1, 5, 15 min)")
    print(f"{w['nodes']} clients, {w['rounds']} rounds, engines {', '.join(w['engines'])}; run config "
          + " ".join(f"{k}={v}" for k, v in w["values"].items()), flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in w["engines"]}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as folder:
        tmp = Path(folder)
        for rep in range(args.reps):
            for name in rotated(w["engines"], rep):
                print(f"[rep {rep}] {name}: load average {load()}", flush=True)
                out = run_engine(name, w, tmp, f"{name}-{rep}", args)
                runs[name].append(out)
                walls = " ".join(f"{s:.2f}" for s in out["rounds"])
                print(f"[rep {rep}] {name}: end-to-end {out['e2e']:.1f} s, rounds {walls} s; "
                      f"load average {load()}", flush=True)
    if w["synthetic"]:
        w["flops"] = flops_per_round(w)
    figures = report(w, runs, args)
    if args.json:
        args.json.write_text(json.dumps({"workload": {k: v for k, v in w.items()}, "runs": runs, **figures},
                                        indent=1, default=str))


if __name__ == "__main__":
    main()
