"""ServerApp: FedAvg (or FedBN, with the clients' fedbn_mod) wrapped by LIPS, recorded per round.

The same seed gives the same numbers: replies are aggregated in the order of
the clients' partition ids, which every reply carries in its metrics (a
simulation draws new node ids in every run, and replies arrive in any order;
float sums depend on the order), and the client-mean metrics are exactly
rounded sums (``math.fsum``).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from logging import WARNING
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from lips_flwr.persistence.checkpoint import resume_option
from lips_flwr.experiments.task.data import DATASET_INFO
from lips_flwr.core.layers import select_layers
from lips_flwr.experiments.task.models import build_model
from lips_flwr._records import record_to_numpy
from lips_flwr.experiments.results import write_json_atomic
from lips_flwr.strategies import LIPS
from lips_paper.algorithms import algorithm

app = ServerApp()

# The client's partition id, in every reply's MetricRecord: the key replies are ordered by. It
# is not a metric: the client-mean leaves it out.
PARTITION_KEY = "partition-id"


def uniform_mean(records: list[RecordDict], weighted_by_key: str) -> MetricRecord:
    """Mean over clients, unweighted (the paper's client-mean accuracy); the weight key summed.

    ``math.fsum`` is exactly rounded: the mean does not depend on the replies' order.
    """
    values: dict[str, list[float]] = defaultdict(list)
    for record in records:
        for metrics in record.metric_records.values():
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != PARTITION_KEY:
                    values[key].append(float(value))
    return MetricRecord({
        key: int(math.fsum(v)) if key == weighted_by_key else math.fsum(v) / len(v)
        for key, v in sorted(values.items())
    })


def partition_id(msg: Message) -> int | None:
    """The client's partition id a reply carries in its metrics; ``None`` without one."""
    for metrics in msg.content.metric_records.values():
        value = metrics.get(PARTITION_KEY)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def content_digest(msg: Message) -> bytes:
    """A digest of everything a reply carries: it reads every byte (about 5 MB a reply at the paper's scale)."""
    digest = hashlib.blake2b(digest_size=16)
    for name, record in sorted(msg.content.items(), key=lambda item: item[0]):
        digest.update(f"{name}\0{type(record).__name__}\0".encode())
        if isinstance(record, ArrayRecord):
            for key, array in record.items():
                digest.update(f"{key}\0{array.dtype}\0{array.shape}\0".encode())
                digest.update(array.data)
        else:
            digest.update(repr(sorted(record.items(), key=lambda item: item[0])).encode())
    return digest.digest()


def stable_order(replies: Iterable[Message]) -> list[Message]:
    """Replies in an order fixed by their clients, not by node ids or arrival.

    Node ids are drawn anew in every simulation run, so an order by node id
    still changes from run to run. Replies go by their client's partition id
    (:func:`partition_id`), errors last. Replies without one (clients of
    another app), and replies that share one (SuperNodes given the same
    partition), go by :func:`content_digest`: stable too, but it reads every byte.
    """
    replies = list(replies)
    ids = [None if msg.has_error() else partition_id(msg) for msg in replies]
    shared = {pid for pid, count in Counter(ids).items() if pid is not None and count > 1}

    def key(item: tuple[Message, int | None]) -> tuple[int, int, bytes]:
        msg, pid = item
        if msg.has_error():
            return (2, 0, b"")
        if pid is None:
            return (1, 0, content_digest(msg))
        return (0, pid, content_digest(msg) if pid in shared else b"")

    return [msg for msg, _ in sorted(zip(replies, ids), key=key)]


class StableFedAvg(FedAvg):
    """FedAvg whose sums take the replies in :func:`stable_order`: the same seed, the same model."""

    def aggregate_train(self, server_round, replies):
        return super().aggregate_train(server_round, stable_order(replies))

    def aggregate_evaluate(self, server_round, replies):
        return super().aggregate_evaluate(server_round, stable_order(replies))


def summarize(rounds: dict) -> dict:
    """Last and best client-mean accuracy, after (received model) and before aggregation.

    Test (``acc-*``) and, when a validation split is carved, validation (``val-acc-*``).
    """
    out = {}
    for prefix in ("acc", "val-acc"):
        for kind, where in (("after", "evaluate"), ("before", "train")):
            key = f"{prefix}-{kind}"
            series = sorted((int(r), m[where][key]) for r, m in rounds.items() if key in m.get(where, {}))
            if series:
                out[f"{key}-last"] = series[-1][1]
                out[f"{key}-best"] = max(a for _, a in series)
    return out


class FreezeMiddleFedAvg(StableFedAvg):
    """The freeze ablation (paper Table 1): after ``freeze_after``, middle layers stop being aggregated.

    They keep the value they had after round ``freeze_after``; the other
    layers are averaged as usual.
    """

    def __init__(self, *, freeze_after: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.freeze_after = freeze_after
        self.current: ArrayRecord | None = None

    def configure_train(self, server_round, arrays, config, grid):
        self.current = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None and self.current is not None and server_round > self.freeze_after:
            middle = set(select_layers(record_to_numpy(self.current), "middle"))
            arrays = ArrayRecord({n: self.current[n] if n in middle else a for n, a in arrays.items()})
        return arrays, metrics


class ResultsFile:
    """The run's JSON results file, rewritten (atomically) after every round.

    A resumed run (``resume`` with a checkpoint) keeps the rounds of the file
    that come before its first round, when the file is its own run's (the
    same run config; a file of another run is left to be overwritten, never
    mixed in: logged). This bookkeeping belongs to the
    process, not to the run: it lives here, not in the strategy, whose plain
    attributes a LIPS checkpoint saves and a resume restores (a restored
    "first round" would make a resumed run drop the rounds before it).
    """

    def __init__(self, path: str, run_config: dict) -> None:
        self.path = path
        self.record = {"run_config": run_config, "rounds": {}, "summary": {}}
        self.started = time.perf_counter()
        self.first_round: int | None = None

    def _keep_earlier_rounds(self, first_round: int) -> None:
        path = Path(self.path)
        if first_round > 1 and self.path and path.exists():
            earlier = json.loads(path.read_text())
            own = json.loads(json.dumps(self.record["run_config"], default=str))
            if earlier.get("run_config") != own:
                log(WARNING, "results file %s holds another run (its run config differs): its rounds are "
                    "not this run's, so rounds 1-%d are missing from the results", self.path, first_round - 1)
                return
            rounds = earlier.get("rounds", {})
            self.record["rounds"] = {r: v for r, v in rounds.items() if int(r) < first_round}

    def save(self, server_round: int, part: str, metrics) -> None:
        """Record ``metrics`` as round ``server_round``'s ``part`` (train, evaluate); write the file."""
        if self.first_round is None:
            self.first_round = server_round
            self._keep_earlier_rounds(server_round)
        entry = self.record["rounds"].setdefault(str(server_round), {})
        entry[part] = dict(metrics or {})
        entry["seconds"] = round(time.perf_counter() - self.started, 3)
        self.record["summary"] = summarize(self.record["rounds"])
        if self.path:
            write_json_atomic(self.path, self.record)


class RecordingLIPS(LIPS):
    """LIPS that writes the run's JSON results file (:class:`ResultsFile`) after every round."""

    def __init__(self, strategy, *, results_path: str, run_config: dict, eval_every: int,
                 eval_before_every: int = 1, eval_last: int = 0, **kwargs):
        super().__init__(strategy, **kwargs)
        self.results = ResultsFile(results_path, run_config)
        self.eval_every, self.eval_before_every, self.eval_last = eval_every, eval_before_every, eval_last

    def _save(self, server_round: int, part: str, metrics) -> None:
        self.results.save(server_round, part, metrics)

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        self._save(server_round, "train", metrics)
        return arrays, metrics

    def _evaluated(self, server_round: int, every: int) -> bool:
        """Round ``server_round`` is evaluated: every ``every`` rounds, the last ``eval_last``, the last."""
        last = self.core.num_rounds or server_round
        return server_round % every == 0 or server_round > last - self.eval_last or server_round == last

    def configure_train(self, server_round, arrays, config, grid):
        # Clients test their trained model ("before" aggregation) only where it is recorded.
        config = ConfigRecord({**config, "eval-before": self._evaluated(server_round, self.eval_before_every)})
        return super().configure_train(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round, arrays, config, grid):
        if not self._evaluated(server_round, self.eval_every):
            return []
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round, replies):
        metrics = super().aggregate_evaluate(server_round, replies)
        if metrics is not None:
            self._save(server_round, "evaluate", metrics)
        return metrics


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    algo = algorithm(str(cfg["algorithm"]))  # ValueError for an unknown name, before any round
    num_rounds = int(cfg["num-server-rounds"])
    num_classes, channels = DATASET_INFO[str(cfg["dataset"])]
    torch.manual_seed(int(cfg["seed"]))  # the same initial model for every algorithm
    net = build_model(str(cfg["model"]), num_classes, channels)
    nodes = max(1, len(list(grid.get_node_ids())))
    base: type[StableFedAvg] = StableFedAvg
    extra: dict = {}
    if algo.freeze:
        base, extra = FreezeMiddleFedAvg, {"freeze_after": int(cfg["freeze-round"])}
    fedavg = base(
        **extra,
        fraction_train=float(cfg["fraction-train"]),
        fraction_evaluate=1.0,
        min_train_nodes=1,
        min_evaluate_nodes=nodes,
        min_available_nodes=nodes,
        train_metrics_aggr_fn=uniform_mean,
        evaluate_metrics_aggr_fn=uniform_mean,
    )
    strategy = RecordingLIPS(
        fedavg,
        results_path=str(cfg["results-path"]),
        run_config=dict(cfg),
        eval_every=max(1, int(cfg["eval-every"])),
        eval_before_every=max(1, int(cfg["eval-before-every"])),
        eval_last=max(0, int(cfg["eval-last"])),
        num_rounds=num_rounds,
        tau0=float(cfg["tau0"]) if algo.score else 0.0,  # tau0 = 0 is the base strategy
        every=int(cfg["every"]),
        score=algo.score or "sensitivity",
        layers=algo.layers,
        **({"trigger": algo.trigger} if algo.trigger != "schedule" else {}),
        inertia_t0=int(cfg["inertia-t0"]) if int(cfg["inertia-t0"]) > 0 else None,
        seed=int(cfg["seed"]),
        checkpoint_path=str(cfg["checkpoint-path"]) or None,
        resume=resume_option(cfg["resume"]),
    )
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(net.state_dict()),
        num_rounds=num_rounds,
        train_config=ConfigRecord({}),
    )
