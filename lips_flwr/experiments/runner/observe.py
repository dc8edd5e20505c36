"""What the runner sees of a run through the batched Grid: the clients' metrics and the global model's steps.

:class:`RunObserver` is the Grid's observer (``run_batched(..., observer=)``,
:class:`~lips_flwr.experiments.batched.GridObserver`). Per round it keeps:

- ``train`` and ``evaluate``: the replies' numeric metrics averaged with
  ``num-examples`` weights (``num_examples`` for the legacy API; a plain mean
  when a reply has no weight: ``"weighting": "uniform"``), ``num-examples``
  itself summed, and the counts of replies, error replies and instructions
  left without a reply;
- ``relative_step``: each weight layer's ``||w_t - w_{t-1}|| / ||w_{t-1}||``
  of the global models the Grid broadcasts (train instructions of round
  ``t + 1`` and evaluate instructions of round ``t`` carry ``w_t``), by
  :func:`~lips_flwr.core.inertia.relative_step`, ``None`` for a layer whose
  ``w_{t-1}`` is all zero (where the core's metric says 0); the
  layers are :func:`~lips_flwr.core.layers.select_layers` ``"all"``, in the
  model's order, and ``"middle"`` marks the middle ones. A strategy that
  sends nodes different models is measured on the lowest node's;
- ``zeros``: the fraction of exact zeros in that model ``w_t``, per layer
  group (``first``, ``middle``, ``last`` weight layer): what a server-mode
  mask round left in the model it broadcast;
- from Flower's log (:mod:`.strategy_log`): ``strategy``, the strategy's own
  aggregated ``lips-*`` train metrics (Message API; not its wall times,
  ``lips-seconds``); ``lips``, a LIPS mask
  round's ``tau`` (and zeros), or why it was not masked; ``no_aggregate``
  when the strategy said the round had none; ``server_evaluate``, the
  ServerApp's own evaluation (``evaluate_fn``; round 0: the initial model).
  The last WARNING and ERROR lines are kept (``warnings``), and the rounds
  that did not move the global model, by why (``stalled_rounds``).

A run fails (:meth:`RunObserver.check`) when most of its trained rounds
did not move the global model (:func:`stalled_rounds`), naming those rounds
and the strategy's last warnings; a round whose train (or evaluate)
instructions were all answered with errors ends it at once
(:class:`RunFailed`): every later round would fail alike. An instruction's
round is :func:`~lips_flwr.experiments.batched.calls.round_of`'s.

The observations so far are kept in the staging folder after every delivery
and every new step, and in a resumable run the last global model too; a
resumed run keeps the rounds before its first new round from them
(:meth:`RunObserver.resume_from`).
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord

from ...core.inertia import relative_step
from ...core.layers import select_layers
from ...persistence.npz_store import write_atomic
from ...persistence.npz_writer import write_npz
from ..results import write_json_atomic
from .store import LAST_GLOBAL, OBSERVED
from .strategy_log import Heard, StrategyLog, numbers

WEIGHT_KEYS = ("num-examples", "num_examples")
KINDS = ("train", "evaluate")
WARNINGS_KEPT = 20  # the last WARNING/ERROR lines of Flower's log a result keeps


class RunFailed(RuntimeError):
    """A run that cannot give a result: its clients all failed a round, or nothing was evaluated."""


def reply_metrics(msg: Message) -> dict[str, float]:
    """A reply's numeric metrics: its MetricRecords and the legacy API's ``*.metrics`` ConfigRecords."""
    out: dict[str, float] = {}
    for name, record in msg.content.items():
        if isinstance(record, MetricRecord) or isinstance(record, ConfigRecord) and name.endswith(".metrics"):
            out.update(numbers(record))
    return out


def weighted_means(replies: list[dict[str, float]]) -> dict[str, Any]:
    """Each metric's mean over the replies that have it, weighted by ``num-examples`` (exact sums)."""
    weight_key = next((k for k in WEIGHT_KEYS if replies and all(r.get(k, 0) > 0 for r in replies)), None)
    out: dict[str, Any] = {"weighting": weight_key or "uniform"}
    keys = sorted({k for r in replies for k in r})
    metrics = {}
    for key in keys:
        have = [r for r in replies if key in r]
        if key == weight_key:
            metrics[key] = math.fsum(r[key] for r in have)
            continue
        weights = [r[weight_key] if weight_key else 1.0 for r in have]
        metrics[key] = math.fsum(w * r[key] for w, r in zip(weights, have)) / math.fsum(weights)
    out["metrics"] = metrics
    return out


def stalled_rounds(rounds: Mapping[Any, Mapping[str, Any]]) -> dict[str, list[int]]:
    """The rounds that did not move the global model, by why (an observed record's ``rounds``).

    ``no_aggregate``: the strategy said so (LIPS's ``round k has no
    aggregate``); ``unchanged``: every weight layer's relative step is 0 (the
    model broadcast after the round is the one before it, e.g. a strategy
    that drops every reply without a word); ``nonfinite``: a step is NaN or
    Inf (the model broadcast after the round is not finite).
    """
    out: dict[str, list[int]] = {"no_aggregate": [], "unchanged": [], "nonfinite": []}
    for key, entry in rounds.items():
        steps = [v for v in (entry.get("relative_step") or {}).values() if v is not None]
        if entry.get("no_aggregate"):
            out["no_aggregate"].append(int(key))
        if steps and not all(math.isfinite(v) for v in steps):
            out["nonfinite"].append(int(key))
        elif steps and all(v == 0 for v in steps):
            out["unchanged"].append(int(key))
    return {why: sorted(found) for why, found in out.items()}


def zero_fractions(weights: dict[str, np.ndarray], layers: dict[str, list[str]]) -> dict[str, float]:
    """The fraction of exact zeros per layer group: the first weight layer, the middle ones, the last."""
    order = [name for name in layers["all"] if name in weights]
    groups = {"first": order[:1], "middle": [n for n in order if n in layers["middle"]],
              "last": order[-1:] if len(order) > 1 else []}
    out = {}
    for group, names in groups.items():
        size = sum(int(weights[n].size) for n in names)
        if size:
            out[group] = sum(int(weights[n].size - np.count_nonzero(weights[n])) for n in names) / size
    return out


class RunObserver:
    """The runner's :class:`~lips_flwr.experiments.batched.GridObserver` (see the module docstring).

    ``staging``: where to keep the partial observations (``observed.json``)
    and, when ``keep_model``, the last global model (``last-global.npz``);
    ``None`` keeps nothing. ``on_round(r)`` is called when round ``r``'s train
    replies are in.
    """

    def __init__(self, staging: Path | None = None, keep_model: bool = False,
                 on_round: Callable[[int], None] | None = None) -> None:
        self.staging, self.keep_model, self.on_round = staging, keep_model, on_round
        self.rounds: dict[int, dict[str, Any]] = {}  # round -> {"train", "evaluate", "relative_step"}
        self._replies: dict[tuple[int, str], list[dict[str, float]]] = {}
        self._counts: dict[tuple[int, str], dict[str, int]] = {}
        self._pending: dict[str, tuple[int, str]] = {}  # instruction id -> (round, kind)
        self.layers: dict[str, list[str]] | None = None
        self.evaluate_keys: list[str] | None = None  # the lowest node's first evaluate reply, in its order
        self._last: tuple[int, dict[str, np.ndarray]] | None = None  # (t, w_t's weight layers)
        self._earlier: dict[int, dict[str, Any]] = {}  # a resumed run's rounds from its partial record
        self.first_round: int | None = None
        self.first_error: str | None = None  # the first error reply's reason (a ClientApp's traceback)
        self.warnings: deque[str] = deque(maxlen=WARNINGS_KEPT)
        self._phase: tuple[int, str] | None = None  # the latest (round, kind) pushed
        self._lock = threading.RLock()
        self._log = StrategyLog(self.heard)

    # -- the Grid's calls ----------------------------------------------------------------------
    def pushed(self, messages: Iterable[Message]) -> None:
        """Instructions just pushed: note their round and kind; read the global model they carry."""
        from ..batched.calls import round_of  # (not at the top: the sweep's process imports this module,
        # and the batched package loads torch, which only its runs' processes need)

        with self._lock:
            messages = list(messages)
            for msg in messages:
                kind = msg.metadata.message_type.split(".")[0]
                rnd = round_of(msg)
                if rnd is None:
                    continue
                if kind == "train" and self.first_round is None:
                    self._start(rnd)
                self._pending[msg.metadata.message_id] = (rnd, kind)
                if kind in KINDS and (self._phase is None or (rnd, kind == "evaluate") >= (
                        self._phase[0], self._phase[1] == "evaluate")):
                    self._phase = (rnd, kind)
                counts = self._counts.setdefault((rnd, kind), {"instructions": 0, "replies": 0, "errors": 0})
                counts["instructions"] += 1
            if messages:
                first = min(messages, key=lambda m: m.metadata.dst_node_id)
                rnd, kind = round_of(first), first.metadata.message_type.split(".")[0]
                arrays = next(iter(first.content.array_records.values()), None)
                if rnd is not None and arrays is not None and kind in KINDS:
                    self._saw_model(rnd - 1 if kind == "train" else rnd, arrays)

    def replied(self, replies: Iterable[Message]) -> None:
        """One delivery's replies (errors included): count them, keep their metrics; fail all-error rounds."""
        with self._lock:
            replies = sorted(replies, key=lambda m: m.metadata.src_node_id)
            delivered: dict[tuple[int, str], list[bool]] = {}  # (round, kind) -> this delivery's error flags
            for msg in replies:
                where = self._pending.pop(msg.metadata.reply_to_message_id, None)
                if where is None or where[1] not in KINDS:
                    continue
                counts = self._counts[where]
                counts["replies"] += 1
                delivered.setdefault(where, []).append(msg.has_error())
                if msg.has_error():
                    counts["errors"] += 1
                    if self.first_error is None:
                        self.first_error = msg.error.reason
                else:
                    metrics = reply_metrics(msg)
                    self._replies.setdefault(where, []).append(metrics)
                    if where[1] == "evaluate" and self.evaluate_keys is None:
                        self.evaluate_keys = list(metrics)
            for where in sorted(delivered):
                self._aggregate(where)
            # Kept before the strategy sees the replies, so before it checkpoints this round: a
            # resumed run finds every round its checkpoint holds in these observations.
            self.save()
            for (rnd, kind), errors in sorted(delivered.items()):
                # A whole round in one delivery (the Message API's strategies), every reply an error.
                # (The legacy API delivers node by node: check() finds its failed rounds at the end.)
                if len(errors) == self._counts[(rnd, kind)]["instructions"] and all(errors):
                    raise RunFailed(f"round {rnd}: every {kind} instruction got an error reply "
                                    f"({len(errors)} of {len(errors)})")
                if kind == "train" and self.on_round is not None:
                    self.on_round(rnd)

    # -- bookkeeping ---------------------------------------------------------------------------
    def heard(self, event: Heard) -> None:
        """What Flower's log told (:mod:`.strategy_log`), kept in the round it is of."""
        with self._lock:
            rnd = event.round if event.round is not None else self._phase[0] if self._phase else None
            if event.kind == "warning" or rnd is None:
                if event.text:
                    self.warnings.append(f"(round {rnd}) {event.text}" if rnd is not None else event.text)
                return
            entry = self.rounds.setdefault(rnd, {})
            if event.kind == "aggregated":
                if self._phase is not None and self._phase[1] == "train":
                    # (not the wall times, ``lips-seconds``: a result holds what the run computed, and a
                    # continued run must equal the uninterrupted one)
                    entry["strategy"] = {k: v for k, v in event.values.items()
                                         if k.startswith("lips-") and not k.endswith("-seconds")}
            elif event.kind == "server_evaluate":
                entry["server_evaluate"] = {"metrics": dict(event.values)}
            elif event.kind == "mask":
                entry["lips"] = dict(event.values)
            else:  # no_aggregate, not_masked: the strategy's reasons
                entry.setdefault("lips", {})["problem"] = event.text
                if event.kind == "no_aggregate":
                    entry["no_aggregate"] = True
                self.warnings.append(event.text)

    def _start(self, first_round: int) -> None:
        """The run's first train round in this process: keep the earlier rounds of a resumed run."""
        self.first_round = first_round
        before = {r: entry for r, entry in self.rounds.items() if r < first_round}  # (round 0's evaluation)
        self.rounds = {**before, **{r: entry for r, entry in self._earlier.items() if r < first_round}}
        if self._last is not None and self._last[0] >= first_round:
            self._last = None  # a model of rounds this run does again

    def _aggregate(self, where: tuple[int, str]) -> None:
        rnd, kind = where
        counts = self._counts[where]
        entry = {**weighted_means(self._replies.get(where, [])), "replies": counts["replies"],
                 "errors": counts["errors"], "missing": counts["instructions"] - counts["replies"]}
        self.rounds.setdefault(rnd, {})[kind] = entry

    def _saw_model(self, index: int, record: ArrayRecord) -> None:
        """The global model ``w_index`` was broadcast: its step from ``w_{index-1}`` when that was seen."""
        if self._last is not None and self._last[0] == index:
            return
        arrays = {name: array.numpy() for name, array in record.items()}
        if self.layers is None:
            self.layers = {"all": select_layers(arrays, "all"), "middle": select_layers(arrays, "middle")}
        weights = {name: arrays[name] for name in self.layers["all"] if name in arrays}
        if self._last is not None and self._last[0] == index - 1 and index >= 1:
            steps = {}
            for name, now in weights.items():
                before = self._last[1].get(name)
                if before is None or before.shape != now.shape:
                    continue
                # None for a zero-norm layer (the core's metric says 0.0): the reports leave it out;
                # a non-finite model gives a NaN step, not None: stalled_rounds() finds it
                step = relative_step(now, before)
                steps[name] = math.nan if step is None and not np.isfinite(before).all() else step
            self.rounds.setdefault(index, {})["relative_step"] = steps
            self.rounds[index]["zeros"] = zero_fractions(weights, self.layers)
            self.save()  # (before the model: a stop between the two computes this step again)
        self._last = (index, weights)
        if self.keep_model and self.staging is not None:
            saved: dict[str, Any] = {**weights, "__round__": np.array(index)}
            write_atomic(self.staging / LAST_GLOBAL, lambda f: write_npz(f, saved))

    # -- records -------------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """The observations as a result file holds them (rounds as strings, in order)."""
        with self._lock:
            return {"rounds": {str(r): self.rounds[r] for r in sorted(self.rounds)}, "layers": self.layers,
                    "evaluate_keys": self.evaluate_keys, "first_round": self.first_round,
                    "warnings": list(self.warnings), "stalled_rounds": stalled_rounds(self.rounds)}

    def save(self) -> None:
        """Keep the observations so far in the staging folder (a resumed run starts from them)."""
        if self.staging is not None:
            write_json_atomic(self.staging / OBSERVED, self.record())

    def resume_from(self, staging: Path) -> None:
        """Take the partial observations and last global model a stopped run of this identity left."""
        try:
            partial = json.loads((staging / OBSERVED).read_text())
        except (OSError, ValueError):
            partial = {}
        self._earlier = {int(r): entry for r, entry in partial.get("rounds", {}).items()}
        with self._lock:  # (all of them, should the run have no round left to train: stopped after its last)
            self.rounds = dict(self._earlier)
        self.layers = partial.get("layers") or self.layers
        self.evaluate_keys = partial.get("evaluate_keys") or self.evaluate_keys
        self.warnings.extend(partial.get("warnings") or [])
        try:
            with np.load(staging / LAST_GLOBAL) as saved:
                arrays = {name: saved[name] for name in saved.files if name != "__round__"}
                self._last = (int(saved["__round__"]), arrays)
        except (OSError, ValueError, KeyError):
            self._last = None

    def check(self, require_evaluate: bool) -> None:
        """``RunFailed`` when a round's train replies were all errors, or no round was evaluated if needed."""
        with self._lock:
            for rnd, entry in sorted(self.rounds.items()):
                train = entry.get("train")
                if train is not None and train["replies"] == train["errors"]:
                    raise RunFailed(f"round {rnd}: no client trained ({train['errors']} error replies, "
                                    f"{train['missing']} left without a reply)")
                evaluate = entry.get("evaluate")
                if evaluate is not None and evaluate["replies"] and evaluate["replies"] == evaluate["errors"]:
                    raise RunFailed(f"round {rnd}: every evaluate reply was an error ({evaluate['errors']})")
            if not any("train" in entry for entry in self.rounds.values()):
                raise RunFailed("no round trained: the ServerApp sent no train instruction the runner read")
            self._check_progress()
            if require_evaluate and not any(
                    entry.get("evaluate", {}).get("metrics") or r >= 1 and entry.get("server_evaluate")
                    for r, entry in self.rounds.items()):
                raise RunFailed("no round was evaluated: no evaluate reply carried metrics, nor did the "
                                "ServerApp evaluate")

    def _check_progress(self) -> None:
        """``RunFailed`` when most trained rounds did not move the global model (:func:`stalled_rounds`)."""
        trained = {r for r, entry in self.rounds.items() if "train" in entry}
        found = stalled_rounds({r: self.rounds[r] for r in trained})
        stuck = set().union(*map(set, found.values()))
        if 2 * len(stuck) <= len(trained):
            return
        why = "; ".join(f"{WHY[k]}: rounds {', '.join(map(str, v))}" for k, v in found.items() if v)
        said = "\n  ".join(["", *self.warnings]) if self.warnings else " (nothing)"
        raise RunFailed(f"{len(stuck)} of its {len(trained)} trained rounds did not move the global model "
                        f"({why}): its result would compare nothing. The strategy's last warnings:{said}")


WHY = {"no_aggregate": "no aggregate", "unchanged": "the model unchanged", "nonfinite": "a non-finite model"}

__all__ = ["RunFailed", "RunObserver", "reply_metrics", "stalled_rounds", "weighted_means", "zero_fractions"]
