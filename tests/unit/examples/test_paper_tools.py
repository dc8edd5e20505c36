"""The paper app's grid table and plot, on synthetic results files (no Flower run)."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import sys
from pathlib import Path
from unittest.mock import Mock

import numpy as np
import pytest

from flower_fakes import task_identity  # noqa: F401

PAPER = Path(__file__).resolve().parents[3] / "examples" / "paper"


def load(name):
    sys.path.insert(0, str(PAPER))
    spec = importlib.util.spec_from_file_location(name, PAPER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(folder: Path, algorithm: str, seed: int, accs: list[float]) -> None:
    rounds = {str(r + 1): {"train": {"acc-before": a + 0.1}, "evaluate": {"acc-after": a}}
              for r, a in enumerate(accs)}
    summary = {"acc-after-last": accs[-1], "acc-after-best": max(accs),
               "acc-before-last": accs[-1] + 0.1, "acc-before-best": max(accs) + 0.1}
    data = {"run_config": {"algorithm": algorithm, "seed": seed}, "rounds": rounds, "summary": summary}
    (folder / f"{algorithm}-seed{seed}.json").write_text(json.dumps(data))


def test_table_reports_mean_std_and_paired_differences(tmp_path):
    write_run(tmp_path, "fedbn", 0, [0.5, 0.6])
    write_run(tmp_path, "fedbn", 1, [0.5, 0.7])
    write_run(tmp_path, "lips", 0, [0.5, 0.65])
    write_run(tmp_path, "lips", 1, [0.8, 0.75])
    text = load("run_grid").table(tmp_path)
    lips = next(line for line in text.splitlines() if line.startswith("lips"))
    assert "0.7000 +- 0.0500" in lips  # last-round mean +- std over the two seeds
    assert "+0.0500 (n=2)" in lips  # paired: (0.05 + 0.05) / 2


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path, "fedbn", 0, [0.5, 0.6, 0.7])
    write_run(tmp_path, "lips", 0, [0.5, 0.65, 0.72])
    out = load("plot").plot_accuracy(tmp_path)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_states_the_setup_marks_mask_rounds_and_uses_a_t_interval(tmp_path):
    plot = load("plot")
    conf = {"samples-per-client": 100, "alpha": 0.1, "num-server-rounds": 3, "local-epochs": 2}
    for algorithm, masks in (("fedbn", (0, 0, 0)), ("lips", (1, 0, 1))):
        rounds = {str(r + 1): {"train": {"num-examples": 2000, "lips-mask-round": m, "acc-before": 0.5},
                               "evaluate": {"acc-after": 0.4}} for r, m in enumerate(masks)}
        data = {"run_config": {"algorithm": algorithm, "seed": 0, **conf}, "rounds": rounds, "summary": {}}
        (tmp_path / f"{algorithm}-seed0.json").write_text(json.dumps(data))
    runs = plot.load_runs(tmp_path)
    assert plot.mask_rounds(runs) == [1, 3]
    assert plot.setup_line(runs) == "20 clients x 100 samples, Dir(0.1), 3 rounds, 2 local epochs"
    mean, half = plot.mean_ci(np.array([[0.5, 0.6], [0.7, 0.6], [0.6, 0.9]]))
    np.testing.assert_allclose(mean, [0.6, 0.7])
    np.testing.assert_allclose(half, [4.302653 * 0.1 / np.sqrt(3), 4.302653 * np.sqrt(0.03) / np.sqrt(3)],
                               rtol=1e-6)  # t(0.975, 2) * sd (ddof=1) / sqrt(n)
    assert plot.mean_ci(np.array([[0.5, 0.6]]))[1] is None
    pytest.importorskip("matplotlib")
    assert plot.plot_accuracy(tmp_path).read_bytes()[:4] == b"\x89PNG"


def test_run_config_string_quotes_strings():
    from lips_flwr.experiments.runner.apps import parse_overrides
    from lips_flwr.experiments.runner.flwr_runs import run_config_string

    assert run_config_string({"a": 1, "b": "x", "c": 0.5, "d": True}) == "a=1 b='x' c=0.5 d=true"
    # A numpy float64 is a float; numpy 2 writes its repr as np.float64(0.5), which is not TOML.
    assert run_config_string({"c": np.float64(0.5), "e": float("inf")}) == "c=0.5 e=inf"
    assert parse_overrides(["num-server-rounds=10", "dataset='digits'", "tau0=0.7"])[0] == {
        "num-server-rounds": 10, "dataset": "digits", "tau0": 0.7}


def test_heatmap_from_a_results_file(tmp_path):
    pytest.importorskip("matplotlib")
    rounds = {str(r): {"train": {"inertia-cos-t0/conv1.weight": 1 - 0.01 * r,
                                 "inertia-cos-t0/fc.weight": 1 - 0.05 * r}} for r in range(3, 8)}
    path = tmp_path / "lips-seed0.json"
    path.write_text(json.dumps({"run_config": {"algorithm": "lips", "seed": 0, "inertia-t0": 2},
                                "rounds": rounds, "summary": {}}))
    out = load("plot").plot_heatmap(path)
    assert out.name == "lips-seed0-heatmap.png" and out.read_bytes()[:4] == b"\x89PNG"
    path.write_text(json.dumps({"run_config": {}, "rounds": {"1": {"train": {}}}, "summary": {}}))
    with pytest.raises(ValueError, match="no inertia-cos-t0"):
        load("plot").plot_heatmap(path)


def test_a_recording_from_a_later_round_keeps_the_results_files_earlier_rounds(tmp_path):
    """What a resumed run does: its first round is the checkpoint's + 1 (4 here, the crash lost 5)."""
    sys.path.insert(0, str(PAPER))
    from flwr.serverapp.strategy import FedAvg
    from lips_paper.server_app import RecordingLIPS

    results = tmp_path / "run.json"
    rounds = {str(r): {"train": {"acc-before": r / 10}} for r in range(1, 6)}
    results.write_text(json.dumps({"run_config": {"x": 1}, "rounds": rounds, "summary": {}}))  # its own run's

    def recorder():
        return RecordingLIPS(FedAvg(), results_path=str(results), run_config={"x": 1}, eval_every=1,
                             num_rounds=10)

    recorder()._save(4, "train", {"acc-before": 0.9})
    data = json.loads(results.read_text())
    assert sorted(data["rounds"], key=int) == ["1", "2", "3", "4"]
    assert data["rounds"]["3"]["train"]["acc-before"] == 0.3
    assert data["rounds"]["4"]["train"]["acc-before"] == 0.9
    recorder()._save(1, "train", {"acc-before": 0.1})  # a run from round 1 keeps nothing of an old file
    assert list(json.loads(results.read_text())["rounds"]) == ["1"]


def test_a_resumed_recording_keeps_no_rounds_of_another_runs_file(tmp_path):
    """Issue 26, defect 1: a results file of another run config (tau0 0.3) is not the resumed run's (0.5)."""
    sys.path.insert(0, str(PAPER))
    from flwr.serverapp.strategy import FedAvg
    from lips_paper.server_app import RecordingLIPS

    results = tmp_path / "lips-seed0.json"
    rounds = {str(r): {"train": {"lips-tau": 0.3}} for r in range(1, 6)}
    results.write_text(json.dumps({"run_config": {"tau0": 0.3}, "rounds": rounds, "summary": {}}))
    recorder = RecordingLIPS(FedAvg(), results_path=str(results), run_config={"tau0": 0.5}, eval_every=1,
                             num_rounds=10)
    recorder._save(4, "train", {"lips-tau": 0.5})
    data = json.loads(results.read_text())
    assert data["run_config"] == {"tau0": 0.5}
    assert list(data["rounds"]) == ["4"]  # rounds 1-3 of the tau0 = 0.3 run are not kept


# --------------------------------------------------------------------------- the same seed, the same numbers
# A simulation gives its SuperNodes new random node ids in every `flwr run`, and replies
# arrive in any order: nothing the paper app sums may depend on either.


def paper_module(name):
    sys.path.insert(0, str(PAPER))
    return importlib.import_module(f"lips_paper.{name}")


def test_client_mean_metrics_do_not_depend_on_the_replies_order():
    from flwr.app import MetricRecord, RecordDict

    uniform_mean = paper_module("server_app").uniform_mean
    values = [1e16, 1.0, -1e16, 3.0, 0.1, 0.2, 0.3]  # a float sum that changes with the order
    records = [RecordDict({"metrics": MetricRecord({"acc": v, "num-examples": 10})}) for v in values]
    results = set()
    for order in itertools.permutations(range(len(records)), 4):
        rest = [i for i in range(len(records)) if i not in order]
        results.add(uniform_mean([records[i] for i in (*order, *rest)], "num-examples")["acc"])
    assert len(results) == 1
    assert results.pop() == pytest.approx(4.6 / 7)
    assert uniform_mean(records, "num-examples")["num-examples"] == 70


def test_client_mean_leaves_the_partition_id_out():
    from flwr.app import MetricRecord, RecordDict

    uniform_mean = paper_module("server_app").uniform_mean
    records = [RecordDict({"metrics": MetricRecord({"acc": a, "num-examples": 10, "partition-id": i})})
               for i, a in enumerate([0.5, 0.7])]
    assert dict(uniform_mean(records, "num-examples")) == {"acc": 0.6, "num-examples": 20}


def test_replies_are_ordered_by_partition_id_without_a_digest(task_identity, monkeypatch):  # noqa: F811
    """Issue 39: the order came from a blake2b digest of every byte of every reply (4.9 s in 4 rounds
    of 100 ResNet8 clients on the H200); the partition id in the metrics orders them now."""
    from flower_fakes import message_reply, tiny_model

    server_app = paper_module("server_app")
    replies = [message_reply(tiny_model(i), node_id=100 - i, **{"partition-id": pid})
               for i, pid in enumerate([3, 0, 2, 1])]
    error = Mock()
    error.has_error.return_value = True
    with monkeypatch.context() as patch:  # no digest of the replies' bytes is made
        patch.setattr(server_app.hashlib, "blake2b", Mock(side_effect=AssertionError("digest made")))
        ordered = server_app.stable_order([error, *replies])
    assert [m.content["metrics"]["partition-id"] for m in ordered[:4]] == [0, 1, 2, 3]
    assert ordered[4] is error
    # A reply without a partition id (another app's client) goes after them, by its content.
    plain = [message_reply(tiny_model(i), node_id=i) for i in range(3)]
    assert server_app.stable_order([plain[2], plain[0], plain[1]]) == server_app.stable_order(plain)
    # Two replies with one partition id (misconfigured SuperNodes) go by their content too, not by arrival.
    twins = [message_reply(tiny_model(i), node_id=i, **{"partition-id": 7}) for i in range(3)]
    first = server_app.stable_order([*twins, replies[1]])
    assert first[0] is replies[1]
    for order in ([2, 0, 1], [1, 2, 0]):
        assert server_app.stable_order([replies[1], *(twins[i] for i in order)]) == first


def test_the_global_model_does_not_depend_on_the_replies_order(task_identity):  # noqa: F811
    from flower_fakes import message_reply, reply, tiny_model

    server_app = paper_module("server_app")
    rng = np.random.default_rng(0)
    models = [{k: (v + rng.normal(scale=0.1, size=v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
               for k, v in tiny_model(i).items()} for i in range(8)]
    sizes = [37, 51, 100, 3, 77, 64, 12, 90]
    first = None
    for trial in range(6):
        order = np.random.default_rng(trial).permutation(8)
        # new random node ids each "run": what the LIPS wrapper's node-id order would give
        ids = np.random.default_rng(100 + trial).permutation(8)
        # The paper ClientApp's replies (with their partition id), and replies of other clients.
        for with_id in (True, False):
            replies = [message_reply(models[i], int(ids[i]), sizes[i], **{"partition-id": int(i)})
                       if with_id else reply(models[i], sizes[i], node_id=int(ids[i])) for i in order]
            replies.sort(key=lambda m: m.metadata.src_node_id)
            for strategy in (server_app.StableFedAvg(), server_app.FreezeMiddleFedAvg(freeze_after=5)):
                arrays, _ = strategy.aggregate_train(1, replies)
                got = {k: v.numpy() for k, v in arrays.items()}
                first = first or {}
                key = (with_id, type(strategy).__name__)
                if key not in first:
                    first[key] = got
                for name in got:
                    assert got[name].tobytes() == first[key][name].tobytes(), (trial, key, name)


def _dropout_client():
    """The paper ClientApp module, a small fedbn-dropout run config on digits, and an initial model."""
    import tomllib

    import torch
    from flwr.app import ArrayRecord

    from lips_flwr.experiments.task.models import build_model

    client_app = paper_module("client_app")
    defaults = tomllib.loads((PAPER / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    run_config = {**defaults, "algorithm": "fedbn-dropout", "dataset": "digits", "model": "digits-cnn",
                  "samples-per-client": 40, "test-samples": 20, "local-epochs": 1, "batch-size": 20,
                  "dropout": 0.5, "device": "cpu"}
    torch.manual_seed(0)
    return client_app, run_config, ArrayRecord(build_model("digits-cnn", 10, 1).state_dict())


def test_dropout_control_trains_the_same_whatever_ran_before(task_identity):  # noqa: F811
    """The dropout control draws from torch's global generator: the client seeds it per round."""
    import torch
    from flwr.app import ConfigRecord, Context, Message, RecordDict

    threads = torch.get_num_threads()
    try:
        client_app, run_config, initial = _dropout_client()
        trained = []
        for noise in (1, 2):
            torch.manual_seed(noise)  # whatever this worker process ran before
            torch.rand(noise * 7)
            ctx = Context(run_id=1, node_id=5, node_config={"partition-id": 1}, state=RecordDict(),
                          run_config=run_config)
            msg = Message(RecordDict({"arrays": initial, "config": ConfigRecord({"server-round": 1})}),
                          dst_node_id=5, message_type="train")
            reply = client_app.train(msg, ctx)
            trained.append({k: v.numpy() for k, v in reply.content["arrays"].items()})
        for name in trained[0]:
            np.testing.assert_array_equal(trained[0][name], trained[1][name])
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)


def test_a_reused_model_replies_as_a_new_one_and_goes_back_without_its_dropout_hooks(task_identity):  # noqa: F811
    """The ClientApp borrows spare models: a reused one must give the numbers a fresh one gives."""
    import torch
    from flwr.app import ConfigRecord, Context, Message, RecordDict

    threads = torch.get_num_threads()
    try:
        client_app, run_config, initial = _dropout_client()

        def train(pid: int, rnd: int = 1) -> dict:
            ctx = Context(run_id=1, node_id=5 + pid, node_config={"partition-id": pid}, state=RecordDict(),
                          run_config=run_config)
            msg = Message(RecordDict({"arrays": initial, "config": ConfigRecord({"server-round": rnd})}),
                          dst_node_id=5 + pid, message_type="train")
            reply = client_app.train(msg, ctx)
            return {k: v.numpy() for k, v in reply.content["arrays"].items()}

        client_app._spare.clear()
        fresh = train(1)  # a new model
        key = ("digits-cnn", 10, 1, "cpu")
        assert len(client_app._spare[key]) == 1
        lent = client_app._spare[key][0]
        spare = lent.net
        state = spare.state_dict(keep_vars=True)  # what the lent model's state must be, object for object
        assert list(lent.state) == list(state) and all(lent.state[n] is t for n, t in state.items())
        assert lent.views.keys() == state.keys()  # (a CPU model: a view of each tensor's own memory)
        assert all(np.shares_memory(lent.views[n], t.detach().numpy()) for n, t in state.items())
        assert not any(m._forward_hooks for m in spare.modules())  # the dropout hooks are gone
        assert all(p.grad is None for p in spare.parameters())  # and its gradients
        train(0, rnd=3)  # another client trains the spare model
        reused = train(1)
        assert [lent.net for lent in client_app._spare[key]] == [spare]  # the same model, borrowed again
        for name in fresh:
            np.testing.assert_array_equal(fresh[name], reused[name])
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)
