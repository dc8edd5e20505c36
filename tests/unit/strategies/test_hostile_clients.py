"""How far ONE malicious client out of 10 can steer which weights LIPS masks.

Server mode, Message API, one mask round (tau = 0.5) on a model with two
1024-entry middle layers. Nine honest clients send ``w + g + noise`` (a
shared direction ``g`` plus as much client noise, both 0.01 per entry). The
attacker picks *targets*: 10% of the entries of ``mid1.weight`` that the mask
keeps when the tenth client is honest, either the most important ones (top
baseline score) or random ones. It knows the honest updates (the usual worst
case in the robust-aggregation literature) and tries:

- ``inflate``: sends the honest mean with a zero update on the targets and
  claims ``num-examples = 10**6`` (the honest clients claim 100);
- ``cancel``: honest weight; on the targets the negated sum of the honest
  updates, so that the FedAvg update there is exactly 0 (``|dw * w| = 0``);
- ``central``: the honest mean with a zero update on the targets: the most
  "typical" update, the one Krum selects;
- ``opposite``: a large update against the honest sign on the targets, to drag
  a median towards 0.

``steered`` is the fraction of targets masked under attack. ``churn`` is the
same fraction when the tenth client is just another honest client: masks move
a little whoever sends the tenth update. Run this file as a script for the
full table of docs/robustness.md (5 seeds, two noise levels).
"""

from __future__ import annotations

import logging
import math
from unittest.mock import Mock

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedMedian, FedTrimmedAvg, Krum

from flower_fakes import grid, reply, task_identity, to_numpy, to_record  # noqa: F401
from lips_flwr.clients import lips_mod
from lips_flwr.strategies import LIPS

pytestmark = pytest.mark.usefixtures("task_identity")

SHAPES = {"stem.weight": (16, 8), "mid1.weight": (32, 32), "mid2.weight": (32, 32),
          "head.weight": (4, 32), "head.bias": (4,)}
MIDDLE = ("mid1.weight", "mid2.weight")
SCALE = 0.01
STRATEGIES = {
    "FedAvg": FedAvg,
    "FedMedian": FedMedian,
    "FedTrimmedAvg": lambda: FedTrimmedAvg(beta=0.2),
    "Krum": lambda: Krum(num_malicious_nodes=1),
}
ATTACKS = ("inflate", "cancel", "central", "opposite")


def population(seed: int, noise: float = 1.0):
    """The global model and ten honest updates."""
    rng = np.random.default_rng(seed)
    w = {k: (0.1 * rng.normal(size=s)).astype(np.float32) for k, s in SHAPES.items()}
    g = {k: SCALE * rng.normal(size=s) for k, s in SHAPES.items()}
    honest = [{k: (g[k] + SCALE * noise * rng.normal(size=s)).astype(np.float32)
               for k, s in SHAPES.items()} for _ in range(10)]
    return w, honest


def lips_aggregate(make_inner, w, updates, examples, **lips) -> dict[str, np.ndarray]:
    strategy = LIPS(make_inner(), num_rounds=10, tau0=0.5, **lips)
    list(strategy.configure_train(1, to_record(w), ConfigRecord(), grid(10)))
    replies = [reply({k: w[k] + u[k] for k in w}, n, node_id=i + 1)
               for i, (u, n) in enumerate(zip(updates, examples))]
    new, _ = strategy.aggregate_train(1, replies)
    return to_numpy(new)


def attacker(attack: str, honest: list, targets: np.ndarray, seed: int, noise: float):
    """The tenth client's update and example count."""
    mean = {k: np.mean([h[k] for h in honest], axis=0) for k in honest[0]}
    update, num_examples, t = dict(mean), 100, mean["mid1.weight"]
    if attack == "honest":  # another honest client: the churn baseline
        rng = np.random.default_rng(10_000 + seed)
        update = {k: v + SCALE * noise * rng.normal(size=v.shape) for k, v in mean.items()}
    elif attack == "inflate":
        update["mid1.weight"], num_examples = np.where(targets, 0.0, t), 10**6
    elif attack == "cancel":
        update["mid1.weight"] = np.where(targets, -np.sum([h["mid1.weight"] for h in honest], axis=0), t)
    elif attack == "central":
        update["mid1.weight"] = np.where(targets, 0.0, t)
    elif attack == "opposite":
        update["mid1.weight"] = np.where(targets, -np.sign(t), t)
    return {k: v.astype(np.float32) for k, v in update.items()}, num_examples


def measure(strategy: str, attack: str, seed: int, targets: str = "top", noise: float = 1.0,
            **lips) -> tuple[float, float]:
    """(fraction of targets masked under attack, Jaccard of the masks with and without it)."""
    make = STRATEGIES[strategy]
    w, honest = population(seed, noise)
    base = lips_aggregate(make, w, honest, [100] * 10, **lips)
    base_masks = {k: base[k] == 0 for k in MIDDLE}
    kept = np.flatnonzero(~base_masks["mid1.weight"].reshape(-1))
    count = base["mid1.weight"].size // 10
    if targets == "top":
        score = np.abs((base["mid1.weight"] - w["mid1.weight"]) * base["mid1.weight"]).reshape(-1)
        chosen = kept[np.argsort(score[kept], kind="stable")[-count:]]
    else:
        chosen = np.random.default_rng(seed + 7).choice(kept, count, replace=False)
    target_mask = np.zeros(base["mid1.weight"].size, bool)
    target_mask[chosen] = True
    target_mask = target_mask.reshape(SHAPES["mid1.weight"])
    update, num_examples = attacker(attack, honest[:9], target_mask, seed, noise)
    attacked = lips_aggregate(make, w, honest[:9] + [update], [100] * 9 + [num_examples], **lips)
    masks = {k: attacked[k] == 0 for k in MIDDLE}
    inter = sum(int((masks[k] & base_masks[k]).sum()) for k in MIDDLE)
    union = sum(int((masks[k] | base_masks[k]).sum()) for k in MIDDLE)
    return float(masks["mid1.weight"][target_mask].mean()), inter / union


SEEDS = (0, 1)


@pytest.fixture(autouse=True)
def quiet_flower():
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


@pytest.mark.parametrize("attack", ["inflate", "cancel"])
def test_with_fedavg_one_client_puts_any_weights_in_the_mask(attack):
    for seed in SEEDS:
        for targets in ("top", "random"):
            steered, _ = measure("FedAvg", attack, seed, targets)
            assert steered == 1.0, (seed, targets)


@pytest.mark.parametrize("strategy", ["FedMedian", "FedTrimmedAvg"])
def test_with_median_or_trimmed_mean_one_client_moves_the_mask_little(strategy):
    for seed in SEEDS:
        churn_top, _ = measure(strategy, "honest", seed, "top")
        churn_random, churn_jaccard = measure(strategy, "honest", seed, "random")
        for attack in ATTACKS:
            top, _ = measure(strategy, attack, seed, "top")
            random, jaccard = measure(strategy, attack, seed, "random")
            # the most important weights stay out of the mask ...
            assert top <= 0.05, (attack, seed, top)
            # ... and arbitrary targets move about as much as with one more honest client
            assert random <= 0.2 and random - churn_random <= 0.12, (attack, seed, random, churn_random)
            assert jaccard >= churn_jaccard - 0.05, (attack, seed, jaccard, churn_jaccard)
        assert churn_top <= 0.02


def test_krum_selects_a_central_attacker_whole():
    """Krum keeps one update: the attacker that looks most typical is that update."""
    for seed in SEEDS:
        assert measure("Krum", "central", seed, "top")[0] == 1.0
        assert measure("Krum", "inflate", seed, "top")[0] == 1.0  # num-examples plays no part
        # extreme updates are not selected
        assert measure("Krum", "cancel", seed, "top")[0] <= 0.35


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_random_score_mask_ignores_the_replies(strategy):
    """score='random' ranks by a seeded draw: no reply can change which weights are zeroed."""
    for attack in ATTACKS:
        steered, jaccard = measure(strategy, attack, 0, "top", score="random")
        assert steered == 0.0 and jaccard == 1.0, attack


# --------------------------------------------------------------------------- client mode
def train_message(model: dict, config: dict) -> Message:
    content = RecordDict({"arrays": to_record(model), "config": ConfigRecord(config)})
    return Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN)


def client_config(rnd: int, tau: float, layers: list[int]) -> dict:
    config = {"lips-round": rnd, "lips-mode": "client", "lips-tau": tau}
    if tau > 0:
        config.update({"lips-score": "sensitivity", "lips-seed": 0, "lips-layers": str(layers)})
    return config


class Trainer:
    """A ClientApp train function that adds a fixed update (``scale`` times a seeded draw)."""

    def __init__(self, seed: int, scale: float = 0.01) -> None:
        self.rng, self.scale, self.received = np.random.default_rng(seed), scale, []

    def __call__(self, msg: Message, ctx: Context) -> Message:
        received = to_numpy(msg.content["arrays"])
        self.received.append(received)
        trained = {k: (v + self.scale * self.rng.normal(size=v.shape)).astype(v.dtype)
                   for k, v in received.items()}
        return Message(RecordDict({"arrays": to_record(trained),
                                   "metrics": MetricRecord({"num-examples": 10})}), reply_to=msg)


def context(node_id: int) -> Context:
    return Context(run_id=1, node_id=node_id, node_config={}, state=RecordDict(), run_config={})


def test_client_mode_a_clients_mask_affects_only_itself():
    """Client B's mask is the same whether or not a hostile client A runs beside it."""
    w, _ = population(0)
    layers = [list(SHAPES).index(n) for n in MIDDLE]

    def run_b(with_a: bool) -> dict:
        b, ctx_b = Trainer(seed=2), context(2)
        if with_a:
            a, ctx_a = Trainer(seed=1, scale=1e6), context(1)  # a wild update, stored as A's signal
            lips_mod(train_message(w, client_config(1, 0.0, layers)), ctx_a, a)
        lips_mod(train_message(w, client_config(1, 0.0, layers)), ctx_b, b)
        if with_a:
            lips_mod(train_message(w, client_config(2, 0.5, layers)), ctx_a, a)
            assert any(np.count_nonzero(a.received[1][n] == 0) for n in MIDDLE)
        lips_mod(train_message(w, client_config(2, 0.5, layers)), ctx_b, b)
        return b.received[1]

    alone, beside_a = run_b(False), run_b(True)
    for name in SHAPES:
        np.testing.assert_array_equal(alone[name], beside_a[name])
    assert all(int((alone[n] == 0).sum()) == math.ceil(alone[n].size * 0.5) for n in MIDDLE)


def test_client_mode_server_config_and_model_ignore_a_hostile_reply():
    """In client mode the server sends every client the same schedule and keeps the model dense."""
    w, honest = population(0)

    def run(hostile: bool):
        strategy = LIPS(FedMedian(), num_rounds=10, tau0=0.5, every=2, mode="client")
        list(strategy.configure_train(1, to_record(w), ConfigRecord(), grid(10)))
        updates = honest[:9] + [{k: np.zeros_like(v) if hostile and k in MIDDLE else v
                                 for k, v in honest[9].items()}]
        replies = [reply({k: w[k] + u[k] for k in w}, 10**6 if hostile and i == 9 else 100, i + 1)
                   for i, u in enumerate(updates)]
        new, _ = strategy.aggregate_train(1, replies)
        messages = list(strategy.configure_train(3, new, ConfigRecord(), grid(10)))
        return to_numpy(new), [dict(m.content["config"]) for m in messages]

    (clean, clean_configs), (attacked, attacked_configs) = run(False), run(True)
    assert clean_configs == attacked_configs
    assert clean_configs[0]["lips-tau"] > 0
    for name in MIDDLE:
        assert not np.any(attacked[name] == 0)  # the server never masks in client mode


if __name__ == "__main__":  # the table in docs/robustness.md
    logging.getLogger("flwr").setLevel(logging.WARNING)
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    for noise in (1.0, 3.0):
        for targets in ("top", "random"):
            print(f"\nnoise/signal {noise:g}, {targets} targets: steered mean (max) over 5 seeds")
            for name in STRATEGIES:
                cells = []
                for attack in ("honest", *ATTACKS):
                    values = [measure(name, attack, s, targets, noise)[0] for s in range(5)]
                    cells.append(f"{attack} {np.mean(values):.2f} ({max(values):.2f})")
                print(f"  {name:14s}" + " | ".join(cells))
