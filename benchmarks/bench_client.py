"""Client overhead of LIPS per ``fit``: delta tracking and client-mode masking.

For each model size (the paper's ResNet8, 1.26M parameters; ResNet-18, 11.2M)
and each Flower API, one client's train call is timed bare and with LIPS:

- Message API: the train function vs ``lips_mod(msg, context, train)``;
- legacy API: ``client.fit`` vs ``LIPSNumPyClient(client, context).fit``;

with LIPS in three situations: server mode (the paper's default: the client
only measures its update and reports its norms), client mode on a round
without a mask (it also stores its update in ``context.state``) and client
mode on a mask round (it masks the received model with last round's update
first). Two train functions:

- ``trivial``: deserialize, add a fixed update, serialize (what any client
  does at least), so the overhead is isolated;
- ``sgd``: a real PyTorch training step: load the state_dict, one epoch of 100
  CIFAR-shaped random samples in one batch of 100 (one SGD step, one thread:
  the paper trains 5 such epochs per round), return the state_dict.

The variants run interleaved round-robin; reported: median seconds, the median
of the paired ratios LIPS/bare, and (trivial train function) the extra peak
memory of the call from tracemalloc (numpy buffers and bytes; torch's own
allocations are not seen, which is why it is measured on the numpy-only
function) plus what LIPS keeps in ``context.state`` between rounds.

    python benchmarks/bench_client.py                 # ~3 minutes
    python benchmarks/bench_client.py --models resnet8 --train trivial
"""

from __future__ import annotations

import one_thread  # noqa: F401  (first: one BLAS thread, set before numpy loads)

import argparse
import json
import time
from collections import OrderedDict

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient

from common import (
    MB, code_line, load_line, machine_line, median, nbytes, num_params, paired_ratio, paired_times,
    peak_bytes, quiet_flower, table, torch_model,
)
from lips_flwr.clients import LIPSNumPyClient, lips_mod
from lips_flwr.clients.state import SIGNAL_KEY, SIGNAL_ROUND_KEY
from lips_flwr.core.layers import select_layers
from lips_flwr._records import numpy_to_record

try:  # Messages need the identity of a running task
    from flwr.supercore.task_identity import TaskIdentity
except ImportError:
    TaskIdentity = None

ROUND = 7  # any round; client-mode masks use a stored update of round ROUND - 1
SITUATIONS = ("server mode", "client mode, no mask", "client mode, mask")


class Setup:
    """One model: its torch net, data, and the train functions of both APIs."""

    def __init__(self, model_name: str, train: str) -> None:
        torch.manual_seed(0)
        self.net = torch_model(model_name)
        state = self.net.state_dict()
        self.names = list(state)
        self.model = {k: v.numpy().copy() for k, v in state.items()}
        self.layers = select_layers(self.model)
        rng = np.random.default_rng(0)
        self.bump = {k: rng.normal(scale=1e-3, size=v.shape).astype(v.dtype)
                     for k, v in self.model.items() if np.issubdtype(v.dtype, np.floating)}
        self.record = ArrayRecord({k: Array(v) for k, v in self.model.items()})
        self.parameters = list(self.model.values())
        # client mode's stored update: last round's local update of the middle layers
        self.signal = numpy_to_record({n: self.bump[n] for n in self.layers})
        self.x = torch.randn(100, 3, 32, 32)
        self.y = torch.randint(0, 100, (100,))
        self.train = train

    def train_arrays(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.train == "trivial":
            return {k: v + self.bump[k] if k in self.bump else v for k, v in arrays.items()}
        from lips_flwr.experiments.task.training import train_tensors  # noqa: PLC0415

        self.net.load_state_dict(OrderedDict((k, torch.from_numpy(np.array(v))) for k, v in arrays.items()))
        train_tensors(self.net, self.x, self.y, epochs=1, batch_size=100, lr=0.1)
        return {k: v.numpy() for k, v in self.net.state_dict().items()}

    # Message API ClientApp train function
    def message_train(self, msg: Message, context: Context) -> Message:
        record = msg.content["arrays"]
        if self.train == "trivial":
            arrays = {k: a.numpy() for k, a in record.items()}
        else:  # what a PyTorch ClientApp does
            arrays = {k: v.numpy() for k, v in record.to_torch_state_dict().items()}
        trained = self.train_arrays(arrays)
        content = RecordDict({"arrays": ArrayRecord({k: Array(np.asarray(v)) for k, v in trained.items()}),
                              "metrics": MetricRecord({"num-examples": 100})})
        return Message(content, reply_to=msg)

    def lips_config(self, situation: str) -> dict:
        """The lips-* keys a LIPS server sends in this situation."""
        if situation == "server mode":
            return {"lips-round": ROUND, "lips-mode": "server"}
        if situation == "client mode, no mask":
            return {"lips-round": ROUND, "lips-mode": "client", "lips-tau": 0.0}
        return {"lips-round": ROUND, "lips-mode": "client", "lips-tau": 0.5,
                "lips-score": "sensitivity", "lips-seed": 0,
                "lips-layers": json.dumps([self.names.index(n) for n in self.layers])}

    def message(self, config: dict) -> Message:
        content = RecordDict({"arrays": self.record, "config": ConfigRecord(config)})
        return Message(content=content, dst_node_id=5, message_type="train")

    def context(self) -> Context:
        return Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})

    def prime(self, context: Context) -> None:
        """Put last round's update into the state (what round ROUND - 1 left)."""
        context.state[SIGNAL_KEY] = self.signal
        context.state[SIGNAL_ROUND_KEY] = ConfigRecord({"round": ROUND - 1})


class UserClient(NumPyClient):
    def __init__(self, setup: Setup) -> None:
        self.setup = setup

    def fit(self, parameters, config):
        trained = self.setup.train_arrays(dict(zip(self.setup.names, parameters)))
        return list(trained.values()), 100, {}


def state_bytes(context: Context) -> int:
    return sum(len(a.data) for record in context.state.array_records.values() for a in record.values())


def measure(model_name: str, train: str, reps: int, memory: bool) -> list[dict]:
    setup = Setup(model_name, train)
    rows = []
    for api in ("message", "legacy"):
        variants, contexts = {}, {}
        if api == "message":
            variants["bare"] = lambda: setup.message_train(setup.message({}), setup.context())
        else:
            client = UserClient(setup)
            variants["bare"] = lambda: client.fit(setup.parameters, {})
        for situation in SITUATIONS:
            config = setup.lips_config(situation)
            ctx = contexts[situation] = setup.context()

            if api == "message":
                def run(config=config, ctx=ctx):
                    setup.prime(ctx)
                    return lips_mod(setup.message(config), ctx, setup.message_train)
            else:
                wrapped = LIPSNumPyClient(UserClient(setup), ctx, param_names=setup.names)

                def run(config=config, ctx=ctx, wrapped=wrapped):
                    setup.prime(ctx)
                    return wrapped.fit(setup.parameters, config)
            variants[situation] = run
        times = paired_times(variants, reps)
        peaks = {}
        if memory:
            peaks = {name: peak_bytes(fn) for name, fn in variants.items()}
        for situation in SITUATIONS:
            ctx = contexts[situation]
            setup.prime(ctx)
            before = state_bytes(ctx)
            variants[situation]()
            rows.append({
                "api": api, "model": model_name, "params": num_params(setup.model),
                "model_bytes": nbytes(setup.model), "train": train, "situation": situation,
                "bare": median(times["bare"]), "lips": median(times[situation]),
                "ratio": paired_ratio(times[situation], times["bare"]),
                "extra": median(times[situation]) - median(times["bare"]),
                "memory": (peaks[situation] - peaks["bare"]) if memory else None,
                "state": state_bytes(ctx) if situation != "server mode" else 0,
                "state_before": before,
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet8,resnet18")
    parser.add_argument("--train", default="trivial,sgd")
    parser.add_argument("--reps", type=int, default=0,
                        help="repetitions per variant (default: 9)")
    args = parser.parse_args()
    quiet_flower()
    torch.set_num_threads(1)  # one thread per simulated client, as in the examples
    if TaskIdentity is not None:
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    print(machine_line(), flush=True)
    print(code_line(), flush=True)
    started = time.perf_counter()
    rows = []
    for model_name in args.models.split(","):
        for train in args.train.split(","):
            reps = args.reps or 9
            rows += measure(model_name, train, reps, memory=train == "trivial")
            print(f"  measured {model_name} {train} ({time.perf_counter() - started:.0f}s)", flush=True)

    print("\nOne fit / train call (median seconds; ratio = median of paired LIPS/bare; "
          "extra = difference of the medians)")
    print(table(
        [[r["api"], f"{r['model']} ({r['params'] / 1e6:.2f}M)", r["train"], r["situation"],
          f"{r['bare']:.4f}", f"{r['lips']:.4f}", f"{r['ratio']:.3f}", f"{r['extra'] * 1e3:+.1f} ms"]
         for r in rows],
        ["API", "model", "train", "LIPS", "bare s", "LIPS s", "ratio", "extra"]))
    print("\nMemory (trivial train function): extra peak of the call (tracemalloc) and what "
          "LIPS keeps in context.state between rounds, MB and in model sizes")
    print(table(
        [[r["api"], r["model"], r["situation"], f"{r['memory'] / MB:+.1f}",
          f"{r['memory'] / r['model_bytes']:+.2f}", f"{r['state'] / MB:.1f}",
          f"{r['state'] / r['model_bytes']:.2f}"]
         for r in rows if r["memory"] is not None],
        ["API", "model", "LIPS", "extra peak MB", "/ model", "state MB", "/ model"]))
    print(f"\ntotal {time.perf_counter() - started:.0f}s; {load_line()}")


if __name__ == "__main__":
    main()
