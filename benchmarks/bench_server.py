"""Server overhead of LIPS: the aggregation step with LIPS vs the bare inner FedAvg.

For each model size (the paper's ResNet8, 1.26M parameters; ResNet-18, 11.2M)
and each Flower API, 100 client replies (real reply ``Message``s, built with
``reply_to=`` a train instruction as a Grid returns them, carrying the
ArrayRecords of tests/unit/flower_fakes.py; legacy: real ``FitRes``) are
aggregated by

- Message API: ``FedAvg()`` vs ``LIPS(FedAvg())``,
- legacy API: ``FedAvg()`` vs ``LegacyLIPS(FedAvg(), param_names=...)``,

on a mask round (round 1, tau = 0.5, from the initial model) and a round
without a mask (round 2, from round 1's FedAvg aggregate, whose integer
buffers Flower averaged into float64 while the clients send integers), each
LIPS call a round of its own (``configure_train`` first, untimed),
interleaved round-robin. Reported per case:

- the median seconds of each, and the median of the paired ratios;
- LIPS's own seconds inside the same call (the LIPS call minus the time its
  inner FedAvg took in that call), and ``1 + own / bare``: the ratio without
  the noise of two separate calls;
- ``read``: only reaching every reply array's bytes and reading its length,
  timed right after a FedAvg call as LIPS's checks are: the least any check
  that looks at each array can cost (cold objects, not bytecode);
- extra peak memory: tracemalloc peak of the LIPS call minus that of the bare
  call, for 10, 50 and 100 replies, in MB and in model sizes (float32 bytes).

Then the masking throughput: ``lips_flwr.core.masking.mask_layers`` on the model's
middle layers, in bytes of those layers per second, against ``np.copy`` of the
same arrays (a memory-bandwidth baseline).

    python benchmarks/bench_server.py                    # both models, ~5 minutes on 2 cores
    python benchmarks/bench_server.py --models resnet8 --reps 9
    python benchmarks/bench_server.py --inner fedavg,fedadam   # also LIPS(FedAdam()) vs FedAdam
    python benchmarks/bench_server.py --inner fedadam,fedavgm  # FedAdam; FedAvgM with server momentum 0.9
"""

from __future__ import annotations

import one_thread  # noqa: F401  (first: one BLAS thread, set before numpy loads)

import argparse
import sys
import time
from operator import attrgetter
from pathlib import Path

import numpy as np

from common import (
    MB, client_models, code_line, load_line, machine_line, make_model, median, nbytes, num_params, paired_ratio,
    paired_times, peak_bytes, quiet_flower, table,
)

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import ndarrays_to_parameters
from flwr.server.strategy import FedAdam as LegacyFedAdam
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.server.strategy import FedAvgM as LegacyFedAvgM
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM

from lips_flwr.core.layers import select_layers
from lips_flwr.core.masking import mask_layers, model_update
from lips_flwr.strategies import LIPS, LegacyLIPS

try:  # Messages built by configure_train need the identity of a running task
    from flwr.supercore.task_identity import TaskIdentity
except ImportError:
    TaskIdentity = None

_DATA = attrgetter("data")
NUM_ROUNDS = 300  # the paper's T; rounds 1, 6, 11, ... mask
ROUNDS = ((1, "mask"), (2, "no mask"))


# ----- replies: real Messages (the unit tests use Mock(spec=Message)), real FitRes -----

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
from flower_fakes import client_manager, fit_result, grid, to_record  # noqa: E402


def reply(model: dict, num_examples: int, node_id: int) -> Message:
    """A node's reply to a train instruction, as the Grid hands it to ``aggregate_train``.

    (A ``Mock(spec=Message)`` reply costs ~15 us per ``has_error()`` call, which
    LIPS makes once per reply: that is the mock's cost, not LIPS's.)
    """
    instruction = Message(RecordDict(), dst_node_id=node_id, message_type=MessageType.TRAIN)
    content = RecordDict({"arrays": to_record(model),
                          "metrics": MetricRecord({"num-examples": num_examples, "train-loss": 0.5})})
    return Message(content, reply_to=instruction)


# ----- strategies that time their own aggregation -----

def timed(strategy_class: type, method: str) -> type:
    """``strategy_class`` whose aggregation ``method`` keeps the seconds of its last call in ``last``."""
    def aggregate(self, *args):
        start = time.perf_counter()
        out = getattr(super(timed_class, self), method)(*args)
        self.last = time.perf_counter() - start
        return out

    timed_class = type(f"Timed{strategy_class.__name__}", (strategy_class,), {method: aggregate, "last": 0.0})
    return timed_class


TimedFedAvg, TimedLegacyFedAvg = timed(FedAvg, "aggregate_train"), timed(LegacyFedAvg, "aggregate_fit")
# --inner: the strategy LIPS wraps, per API (FedAdam and FedAvgM keep state: the reply gate checks
# it too; FedAvgM with server momentum keeps a copy of the model, which LIPS's mask rounds zero too).
INNERS = {
    ("message", "fedavg"): lambda base: TimedFedAvg(),
    ("message", "fedadam"): lambda base: timed(FedAdam, "aggregate_train")(),
    ("message", "fedavgm"): lambda base: timed(FedAvgM, "aggregate_train")(server_momentum=0.9),
    ("legacy", "fedavg"): lambda base: TimedLegacyFedAvg(),
    ("legacy", "fedadam"): lambda base: timed(LegacyFedAdam, "aggregate_fit")(
        initial_parameters=ndarrays_to_parameters(list(base.values()))),
    ("legacy", "fedavgm"): lambda base: timed(LegacyFedAvgM, "aggregate_fit")(
        server_momentum=0.9, initial_parameters=ndarrays_to_parameters(list(base.values()))),
}


# ----- measurements -----

def measure(api: str, model_name: str, clients: int, reps: int, memory_clients: list[int],
            inner: str = "fedavg") -> list[dict]:
    base = make_model(model_name, seed=0)
    names = list(base)
    trained = client_models(base, clients)
    bare_inner, lips_inner = INNERS[api, inner](base), INNERS[api, inner](base)
    if api == "message":
        previous = to_record(base)
        replies = [reply(m, 100, i + 1) for i, m in enumerate(trained)]
        lips = LIPS(lips_inner, num_rounds=NUM_ROUNDS)
        g = grid(clients)

        def configure(rnd):
            lips.configure_train(rnd, previous, ConfigRecord(), g)
            bare_inner.configure_train(rnd, previous, ConfigRecord(), g)  # FedAdam keeps the model here

        def call(strategy, rnd, n=clients):
            return strategy.aggregate_train(rnd, replies[:n])

        def read_all():  # each reply's records, and each array's bytes reached and their length read
            for msg in replies:
                for record in msg.content.values():
                    if isinstance(record, ArrayRecord):
                        list(map(len, map(_DATA, record.values())))
    else:
        previous = ndarrays_to_parameters(list(base.values()))
        results = [fit_result(m, 100, str(i + 1)) for i, m in enumerate(trained)]
        lips = LegacyLIPS(lips_inner, param_names=names, num_rounds=NUM_ROUNDS)
        manager = client_manager(clients)

        def configure(rnd):
            lips.configure_fit(rnd, previous, manager)

        def call(strategy, rnd, n=clients):
            return strategy.aggregate_fit(rnd, results[:n], [])

        def read_all():
            for _, res in results:
                list(map(len, res.parameters.tensors))

    # Time the reply checks (the reply gate's admission: the per-reply checks, the votes, any
    # cast) apart from the rest.
    checks: list[float] = []
    gate = lips._lips_gate
    original = gate.admit

    def timed_check(*args, **kwargs):
        start = time.perf_counter()
        out = original(*args, **kwargs)
        checks.append(time.perf_counter() - start)
        return out

    gate.admit = timed_check  # type: ignore[method-assign]

    rows = []
    for rnd, kind in ROUNDS:
        if rnd > 1:  # as in a run: the global model is the last aggregate (FedAvg's float64 buffers)
            previous = call(bare_inner, rnd - 1)[0]
        configure(rnd)
        own: list[float] = []
        checks.clear()

        # LIPS's own time = the LIPS call minus its inner FedAvg in the same call. Each call is
        # a round of its own (configure first, untimed): the global model's headers are read
        # in every round, as in a run.
        def timed_lips():
            configure(rnd)
            start = time.perf_counter()
            call(lips, rnd)
            own.append(time.perf_counter() - start - lips_inner.last)

        times = paired_times({"bare": lambda: call(bare_inner, rnd), "lips": timed_lips}, reps)
        own, check = own[-reps:], checks[-reps:] or [0.0]
        reads = []  # the floor of any per-array check: reading each array once, as cold as LIPS finds it
        for _ in range(reps):
            call(bare_inner, rnd)
            start = time.perf_counter()
            read_all()
            reads.append(time.perf_counter() - start)
        memory = {}
        for n in memory_clients:
            bare_peak = peak_bytes(lambda: call(bare_inner, rnd, n))
            lips_peak = peak_bytes(lambda: call(lips, rnd, n))
            memory[n] = (bare_peak, lips_peak)
        rows.append({
            "api": api, "inner": type(bare_inner).__name__[len("Timed"):], "model": model_name,
            "round": kind, "clients": clients,
            "params": num_params(base), "model_bytes": nbytes(base),
            "bare": median(times["bare"]), "lips": median(times["lips"]),
            "ratio": paired_ratio(times["lips"], times["bare"]),
            "own": median(own), "own_ratio": 1 + median(own) / median(times["bare"]),
            "check": median(check), "read": median(reads),
            "memory": memory,
        })
    return rows


def masking_throughput(model_name: str, reps: int) -> dict:
    prev = make_model(model_name, seed=0)
    new = next(client_models(prev, 1, seed=2))
    layers = select_layers(new)
    arrays = [new[n] for n in layers]
    size = sum(a.nbytes for a in arrays)
    updates = model_update(new, prev, layers)
    variants = {
        "np.copy": lambda: [np.copy(a) for a in arrays],
        "dw = new - old": lambda: model_update(new, prev, layers),
        "sparsify sensitivity": lambda: mask_layers(new, layers, 0.5, score="sensitivity", updates=updates),
        "sparsify magnitude": lambda: mask_layers(new, layers, 0.5, score="magnitude"),
        "sparsify random": lambda: mask_layers(new, layers, 0.5, score="random"),
    }
    times = paired_times(variants, reps)
    return {"model": model_name, "bytes": size, "layers": len(layers),
            "times": {k: median(v) for k, v in times.items()},
            "ratios": {k: paired_ratio(v, times["np.copy"]) for k, v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet8,resnet18")
    parser.add_argument("--api", default="message,legacy")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--reps", type=int, default=0,
                        help="repetitions per variant (default: 11 for resnet8, 4 for resnet18)")
    parser.add_argument("--memory-clients", default="10,100")
    parser.add_argument("--inner", default="fedavg", help="the wrapped strategies: fedavg, fedadam, fedavgm")
    args = parser.parse_args()
    quiet_flower()
    if TaskIdentity is not None:
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    print(machine_line(), flush=True)
    print(code_line(), flush=True)
    started = time.perf_counter()
    memory_clients = [n for n in map(int, args.memory_clients.split(",")) if n <= args.clients]
    rows, masks = [], []
    for model_name in args.models.split(","):
        reps = args.reps or (11 if model_name == "resnet8" else 4)
        for api in args.api.split(","):
            for inner in args.inner.split(","):
                rows += measure(api, model_name, args.clients, reps, memory_clients, inner)
                print(f"  measured {api} {inner} {model_name} ({time.perf_counter() - started:.0f}s)",
                      flush=True)
        masks.append(masking_throughput(model_name, max(reps, 7)))

    print(f"\nAggregation step, {args.clients} replies (median seconds). ratio: median of the paired "
          "LIPS/FedAvg calls; own: LIPS's time inside its call (the call minus its inner FedAvg); "
          "checks: the reply gate's admission (checks, votes) within own; read: only reaching every reply "
          "array's bytes and reading its length, right after a FedAvg call (the floor of any check "
          "that looks at each array)")
    target = lambda r, x: "yes" if x <= (1.05 if r["round"] == "mask" else 1.02) else "NO"  # noqa: E731
    print(table(
        [[r["api"], r["inner"], f"{r['model']} ({r['params'] / 1e6:.2f}M)", r["round"], f"{r['bare']:.3f}",
          f"{r['lips']:.3f}", f"{r['ratio']:.3f}", f"{r['own'] * 1e3:.1f} ms",
          f"{r['check'] * 1e3:.1f} ms", f"{1 + (r['own'] - r['check']) / r['bare']:.3f}",
          target(r, 1 + (r["own"] - r["check"]) / r["bare"]), f"{r['own_ratio']:.3f}",
          target(r, r["own_ratio"]), f"{r['read'] * 1e3:.1f} ms", f"{1 + r['read'] / r['bare']:.3f}"]
         for r in rows],
        ["API", "inner", "model", "round", "inner s", "LIPS s", "ratio", "own", "checks",
         "1+(own-checks)/inner", "target", "1+own/inner", "target", "read", "1+read/inner"]))

    print("\nPeak memory of the aggregation step above what was allocated before (tracemalloc), MB; "
          "extra = LIPS - FedAvg, also in model sizes")
    mem_rows = []
    for r in rows:
        for n, (bare_peak, lips_peak) in r["memory"].items():
            extra = lips_peak - bare_peak
            mem_rows.append([r["api"], r["inner"], r["model"], r["round"], n, f"{bare_peak / MB:.1f}",
                             f"{lips_peak / MB:.1f}", f"{extra / MB:+.1f}",
                             f"{extra / r['model_bytes']:+.2f}"])
    print(table(mem_rows, ["API", "inner", "model", "round", "replies", "inner MB", "LIPS MB",
                           "extra MB", "extra / model"]))

    print("\nMasking throughput on the middle layers (tau = 0.5): bytes of those layers per second")
    thr_rows = []
    for m in masks:
        for name, seconds in m["times"].items():
            thr_rows.append([m["model"], f"{m['layers']} layers, {m['bytes'] / MB:.1f} MB", name,
                             f"{seconds * 1e3:.1f} ms", f"{m['bytes'] / seconds / 1e9:.2f} GB/s",
                             f"{m['ratios'][name]:.1f}x"])
    print(table(thr_rows, ["model", "masked", "operation", "median", "throughput", "time / np.copy"]))
    print(f"\ntotal {time.perf_counter() - started:.0f}s; {load_line()}")


if __name__ == "__main__":
    main()
