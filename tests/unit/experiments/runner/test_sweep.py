"""The one experiment runner: what the Grid shows it, what it reuses or refuses, whole sweeps of a tiny app.

The sweeps run real processes (``spawn``) of a numpy-only Flower App
(``runner_apps.py``) on the batched Grid, a few rounds each.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from flower_fakes import task_identity  # noqa: F401
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from runner_apps import make_app

from lips_flwr.experiments.runner.observe import RunFailed, RunObserver, weighted_means
from lips_flwr.experiments.runner.runs import RunSpec, prepare
from lips_flwr.experiments.runner.slots import available_cores
from lips_flwr.experiments.runner.store import read_result, write_result
from lips_flwr.experiments.runner.sweep import SweepFailed, plan, run_sweep

# --------------------------------------------------------------------------- the observer


def instruction(kind: str, rnd: int, node: int, arrays: dict | None = None) -> Message:
    content = RecordDict({"config": ConfigRecord({"server-round": rnd})})
    if arrays is not None:
        content["arrays"] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    msg = Message(content, dst_node_id=node, message_type=kind)
    msg.metadata.__dict__["_message_id"] = f"{kind}-{rnd}-{node}"
    return msg


def reply(to: Message, metrics: dict | None) -> Message:
    if metrics is None:
        out = Message(Error(code=2, reason=f"client {to.metadata.dst_node_id} failed"), reply_to=to)
    else:
        out = Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=to)
    out.metadata.__dict__["_src_node_id"] = to.metadata.dst_node_id
    return out


MODEL = {"first.weight": np.ones((2, 3), np.float32), "mid.weight": np.full((3, 3), 2.0, np.float32),
         "last.weight": np.ones((3, 2), np.float32), "last.bias": np.zeros(2, np.float32)}


def test_metrics_are_averaged_with_num_examples_weights():
    out = weighted_means([{"acc": 0.5, "num-examples": 10}, {"acc": 1.0, "num-examples": 30, "x": 2.0}])
    assert out["weighting"] == "num-examples"
    assert out["metrics"] == {"acc": pytest.approx(0.875), "num-examples": 40, "x": 2.0}
    assert weighted_means([{"acc": 0.5}, {"acc": 1.0}])["metrics"]["acc"] == 0.75  # no weights: plain mean


def test_the_observer_keeps_each_rounds_metrics_and_each_layers_relative_step(tmp_path, task_identity):  # noqa: F811
    observer = RunObserver(tmp_path, keep_model=True)
    seen = []
    observer.on_round = seen.append
    train = [instruction("train", 1, n, MODEL) for n in (1001, 1000)]
    observer.pushed(train)
    observer.replied([reply(train[1], {"loss": 1.0, "num-examples": 10}), reply(train[0], None)])
    moved = {**MODEL, "mid.weight": MODEL["mid.weight"] * 1.5}
    evaluate = [instruction("evaluate", 1, n, moved) for n in (1000, 1001)]
    observer.pushed(evaluate)
    observer.replied([reply(evaluate[0], {"zeta": 1.0, "accuracy": 0.5, "num-examples": 1}),
                      reply(evaluate[1], {"zeta": 3.0, "accuracy": 0.9, "num-examples": 3})])
    rnd = observer.record()["rounds"]["1"]
    assert rnd["train"] == {"weighting": "num-examples", "metrics": {"loss": 1.0, "num-examples": 10.0},
                            "replies": 2, "errors": 1, "missing": 0}
    assert rnd["evaluate"]["metrics"]["accuracy"] == pytest.approx(0.8)
    assert rnd["relative_step"] == {"first.weight": 0.0, "mid.weight": pytest.approx(0.5), "last.weight": 0.0}
    assert observer.record()["layers"] == {"all": ["first.weight", "mid.weight", "last.weight"],
                                           "middle": ["mid.weight"]}
    assert observer.evaluate_keys == ["zeta", "accuracy", "num-examples"]  # the lowest node's, in its order
    assert observer.first_error == "client 1001 failed" and seen == [1]
    with np.load(tmp_path / "last-global.npz") as saved:
        assert int(saved["__round__"]) == 1 and np.array_equal(saved["mid.weight"], moved["mid.weight"])


def test_a_round_whose_replies_are_all_errors_fails_the_run(task_identity):  # noqa: F811
    observer = RunObserver()
    train = [instruction("train", 1, n, MODEL) for n in (1000, 1001)]
    observer.pushed(train)
    with pytest.raises(RunFailed, match="round 1: every train instruction got an error reply"):
        observer.replied([reply(m, None) for m in train])
    late = RunObserver()  # the legacy API delivers node by node: found at the end
    for msg in train:
        late.pushed([msg])
    for msg in train:
        late.replied([reply(msg, None)])
    with pytest.raises(RunFailed, match="round 1: no client trained"):
        late.check(require_evaluate=False)
    quiet = RunObserver()
    quiet.pushed(train)
    quiet.replied([reply(m, {"loss": 1.0}) for m in train])
    quiet.check(require_evaluate=False)
    with pytest.raises(RunFailed, match="no round was evaluated"):
        quiet.check(require_evaluate=True)


def test_a_resumed_run_keeps_its_earlier_rounds_and_its_first_step(tmp_path, task_identity):  # noqa: F811
    first = RunObserver(tmp_path, keep_model=True)
    for rnd, scale in ((1, 1.0), (2, 2.0)):
        model = {**MODEL, "mid.weight": MODEL["mid.weight"] * scale}
        train = [instruction("train", rnd, 1000, model)]
        first.pushed(train)
        first.replied([reply(train[0], {"loss": float(rnd), "num-examples": 1})])
    first.pushed([instruction("train", 3, 1000, {**MODEL, "mid.weight": MODEL["mid.weight"] * 4.0})])
    # killed here, during round 3; the checkpoint is round 2's: the resumed run starts at round 3
    again = RunObserver(tmp_path, keep_model=True)
    again.resume_from(tmp_path)
    train = [instruction("train", 3, 1000, {**MODEL, "mid.weight": MODEL["mid.weight"] * 4.0})]
    again.pushed(train)
    again.replied([reply(train[0], {"loss": 3.0, "num-examples": 1})])
    rounds = again.record()["rounds"]
    assert sorted(rounds) == ["1", "2", "3"] and rounds["1"]["train"]["metrics"]["loss"] == 1.0
    assert rounds["1"]["relative_step"]["mid.weight"] == pytest.approx(1.0)  # w_1 / w_0: x2
    assert rounds["2"]["relative_step"]["mid.weight"] == pytest.approx(1.0)  # w_2 / w_1, seen before the stop
    assert again.first_round == 3


# --------------------------------------------------------------------------- reuse, refuse, recompute


def spec(app: Path, name: str = "run", seed: int = 0, **kwargs) -> RunSpec:
    return RunSpec(app, name, seed, num_nodes=3, engine="sequential", **kwargs)


def finished(out: Path, job) -> None:
    write_result(job.result, job.identity, {"python": "3"}, {"rounds": {}}, None)


def test_a_result_of_the_same_identity_is_reused_and_one_of_another_refused(tmp_path):
    app = make_app(tmp_path / "app")
    out = tmp_path / "out"
    job = prepare(spec(app, overrides={"tau0": 0.3}), out)
    finished(out, job)
    logged: list[str] = []
    assert plan([job], recompute=False, progress=logged.append) == []
    assert "reused" in logged[0]
    other = prepare(spec(app, overrides={"tau0": 0.5}), out)
    with pytest.raises(ValueError, match=r"(?s)refusing to run.*run_config\.tau0: file 0\.3, now 0\.5"):
        plan([other], recompute=False, progress=logged.append)
    assert plan([other], recompute=True, progress=logged.append) == [other]
    assert "recomputing" in logged[-1]
    forced = prepare(spec(app, overrides={"tau0": 0.3}, lips_off=True), out)
    with pytest.raises(ValueError, match=r"lips_forced\.tau0: file \(none\), now 0\.0"):
        plan([forced], recompute=False, progress=logged.append)
    seeded = prepare(spec(app, seed=7, overrides={"tau0": 0.3}), out)
    with pytest.raises(ValueError, match="seed: file 0, now 7"):
        plan([seeded], recompute=False, progress=logged.append)


def test_a_file_of_an_earlier_session_is_compared_by_its_run_config(tmp_path):
    app = make_app(tmp_path / "app", resumable=True)
    out = tmp_path / "out"
    job = prepare(spec(app), out)
    old = {"run_config": {**job.identity["run_config"], "checkpoint-path": "/old/x.npz", "resume": "auto"},
           "rounds": {}, "summary": {}}
    job.result.parent.mkdir(parents=True)
    job.result.write_text(json.dumps(old))
    logged: list[str] = []
    assert plan([job], recompute=False, progress=logged.append) == []
    assert "its code, engine and environment cannot be checked" in logged[0]
    old["run_config"]["lr"] = 0.9
    job.result.write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"run_config\.lr: file 0\.9, now 0\.3"):
        plan([job], recompute=False, progress=logged.append)


def test_runner_managed_keys_and_duplicate_names_are_errors_before_anything_runs(tmp_path):
    app = make_app(tmp_path / "app", resumable=True)
    with pytest.raises(ValueError, match=r"\['checkpoint-path'\] are managed by the runner"):
        prepare(spec(app, overrides={"checkpoint-path": "/tmp/x.npz"}), tmp_path / "out")
    with pytest.raises(ValueError, match="unknown run-config keys"):
        prepare(spec(app, overrides={"nope": 1}), tmp_path / "out")
    twice = [spec(app, "same"), spec(make_app(tmp_path / "other"), "same")]
    with pytest.raises(ValueError, match="two runs of one sweep would write one result file: 'same'"):
        run_sweep(twice, tmp_path / "out", progress=lambda line: None)
    assert not (tmp_path / "out" / ".staging").exists()


def test_a_lips_off_run_under_flwr_run_is_an_error_not_a_run_with_lips_on(tmp_path):
    # `flwr run` builds the app in processes the forcing does not reach: it would run LIPS as written.
    app = make_app(tmp_path / "app", lips=True)
    with pytest.raises(ValueError, match=r"LIPS-off run \(lips_off=True\) needs the batched Grid"):
        prepare(RunSpec(app, "run", 0, num_nodes=3, engine="flwr", lips_off=True), tmp_path / "out")
    assert prepare(RunSpec(app, "run", 0, num_nodes=3, engine="flwr"), tmp_path / "out").identity["engine"] == "flwr"


def test_managed_keys_point_into_the_staging_folder_and_stay_out_of_the_identity(tmp_path):
    app = make_app(tmp_path / "app", resumable=True, results=True)
    job = prepare(spec(app, "conf/lips-seed3", seed=3, location_keys=("lr",)), tmp_path / "out")
    staging = tmp_path / "out" / ".staging" / "conf" / "lips-seed3"
    assert job.staging == staging and job.result == tmp_path / "out" / "conf" / "lips-seed3.json"
    assert job.run_config["checkpoint-path"] == str(staging / "checkpoint.npz")
    assert job.run_config["resume"] == "auto" and job.resumable
    assert set(job.identity["run_config"]) == {"num-server-rounds", "tau0", "sleep"}  # lr: a location key
    assert job.identity["engine"] == "sequential" and job.identity["num_nodes"] == 3 and job.num_rounds == 3
    assert job.locations == {"lr": 0.3}


# --------------------------------------------------------------------------- whole sweeps


@pytest.mark.slow
def test_a_sweep_writes_identity_provenance_and_observations_and_leaves_nothing_else(tmp_path, monkeypatch):
    app = make_app(tmp_path / "app", lips=True, resumable=True, results=True)
    out = tmp_path / "out"
    lines: list[str] = []
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)  # (a caller's own setting would win over the share)
    blas = {"OPENBLAS_NUM_THREADS": "1"}  # a run's own environment, set before its imports
    before = os.environ.get("OPENBLAS_NUM_THREADS")
    specs = [spec(app, f"{arm}-seed5", seed=5, lips_off=arm == "a", env=blas if arm == "a" else {})
             for arm in ("a", "b")]
    paths = run_sweep(specs, out, jobs=2, progress=lines.append)
    assert os.environ.get("OPENBLAS_NUM_THREADS") == before  # the sweep's own is left as it was
    assert sorted(p.name for p in out.iterdir()) == ["a-seed5.json", "b-seed5.json"]  # no staging, no lock
    a, b = (read_result(p) for p in paths)
    assert a.identity["lips_forced"] == {"tau0": 0.0} and b.identity["lips_forced"] == {}
    assert a.provenance["engine"] == "sequential" and a.provenance["wall_seconds"] > 0
    assert a.provenance["numpy"] == np.__version__ and a.provenance["started"].endswith("+00:00")
    assert a.provenance["threads"]["OPENBLAS_NUM_THREADS"] == "1"
    share = str(max(1, available_cores() // 2))  # no env of its own: the cores shared by the 2 jobs
    assert b.provenance["threads"]["OPENBLAS_NUM_THREADS"] == share
    assert b.provenance["threads"]["OMP_NUM_THREADS"] == share
    assert b.provenance["threads"]["torch"] == int(share)
    assert sorted(a.observed["rounds"]) == ["1", "2", "3"]
    assert a.observed["rounds"]["1"]["train"]["replies"] == 3 and a.observed["evaluate_keys"][:2] == [
        "loss", "accuracy"]
    assert a.app["rounds"] == 3 and a.app["run_config"]["results-path"].endswith("a-seed5/app-results.json")
    # LIPS masks after round 1 in arm B only: its middle layer jumps
    step_a = a.observed["rounds"]["1"]["relative_step"]["mid.weight"]
    step_b = b.observed["rounds"]["1"]["relative_step"]["mid.weight"]
    assert step_b > step_a
    assert any("round 3/3" in line for line in lines) and any("ETA" in line for line in lines)
    again: list[str] = []
    run_sweep(specs, out, jobs=1, progress=again.append)
    assert again == [f"[{s.name}] reused {str(out / (s.name + '.json'))!r}" for s in specs]


@pytest.mark.slow
def test_the_same_sweep_gives_the_same_numbers_whatever_the_jobs(tmp_path):
    app = make_app(tmp_path / "app")
    specs = [spec(app, f"seed{s}", seed=s) for s in (1, 2)]
    one = [read_result(p).observed["rounds"] for p in run_sweep(specs, tmp_path / "one", jobs=1,
                                                                  progress=lambda line: None)]
    two = [read_result(p).observed["rounds"] for p in run_sweep(specs, tmp_path / "two", jobs=2,
                                                                  progress=lambda line: None)]
    assert one == two and one[0] != one[1]  # the app never seeds: the runner's seeds decide


@pytest.mark.slow
def test_a_failing_app_stops_the_sweep_with_its_clients_first_error(tmp_path):
    app = make_app(tmp_path / "app", fail=True)
    with pytest.raises(SweepFailed) as err:
        run_sweep([spec(app, "broken")], tmp_path / "out", progress=lambda line: None)
    assert "RunFailed: round 1: every train instruction got an error reply" in str(err.value)
    assert "RuntimeError: tiny app: this ClientApp fails on every call" in str(err.value)  # a client's
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []  # no result, no staging, no lock


@pytest.mark.slow
def test_a_run_process_that_ends_without_a_word_fails_the_sweep_with_its_log(tmp_path):
    """A process that exits at the app's import (``os._exit``): its log's end in the error, no staging."""
    app = make_app(tmp_path / "app")
    client = app / "tinyapp" / "client_app.py"
    leave = "import os\nprint('tiny app: leaving at import', flush=True)\nos._exit(3)\n"
    client.write_text(leave + client.read_text())
    with pytest.raises(SweepFailed) as err:
        run_sweep([spec(app, "gone")], tmp_path / "out", progress=lambda line: None)
    # (Ray does not tell a dead worker's exit code: the error names the death, the log says why)
    assert "[gone] its process ended before reporting (WorkerCrashedError: its worker process died" \
        in str(err.value)
    assert "tiny app: leaving at import" in str(err.value)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


def test_names_of_which_one_is_a_folder_of_the_other_are_an_error_before_anything_runs(tmp_path):
    """``x`` and ``x/y`` nest their staging folders: a claim of ``x`` would remove ``x/y``'s progress."""
    app = make_app(tmp_path / "app")
    nested = [spec(app, "x"), spec(app, "x/y", seed=1), spec(app, "z/w", seed=2)]
    with pytest.raises(ValueError, match=r"would share a staging folder.*: 'x' and 'x/y' \(rename one"):
        run_sweep(nested, tmp_path / "out", progress=lambda line: None)
    assert not (tmp_path / "out").exists()  # refused before the lock or any staging folder


def test_the_stacked_engines_chunk_size_is_in_a_stacked_runs_identity_only(tmp_path):
    app, out = make_app(tmp_path / "app"), tmp_path / "out"
    four = prepare(RunSpec(app, "run", 0, num_nodes=3, engine="stacked", chunk_size=4), out)
    assert four.identity["chunk_size"] == 4
    finished(out, four)
    eight = prepare(RunSpec(app, "run", 0, num_nodes=3, engine="stacked", chunk_size=8), out)
    with pytest.raises(ValueError, match="chunk_size: file 4, now 8"):
        plan([eight], recompute=False, progress=lambda line: None)
    whole = prepare(RunSpec(app, "run", 0, num_nodes=3, engine="stacked"), out)
    assert whole.identity["chunk_size"] is None
    sequential = prepare(RunSpec(app, "run", 0, num_nodes=3, engine="sequential", chunk_size=4), out)
    assert "chunk_size" not in sequential.identity  # its results of earlier versions keep matching


@pytest.mark.slow
def test_a_run_process_stopped_by_ctrl_c_keeps_its_staging_folder_to_continue(tmp_path):
    """The worker ends a Ctrl-C'd run with exit status 130: a stop, not a failure, so its progress stays."""
    app = make_app(tmp_path / "app", resumable=True)
    client = app / "tinyapp" / "client_app.py"
    sleep = '    time.sleep(float(context.run_config["sleep"]))\n'
    client.write_text(client.read_text().replace(sleep, "    raise KeyboardInterrupt  # as a Ctrl-C here\n"))
    out = tmp_path / "out"
    with pytest.raises(SweepFailed) as err:
        run_sweep([spec(app, "stopped")], out, progress=lambda line: None)
    assert "[stopped] its process was stopped (exit code 130, Ctrl-C)" in str(err.value)
    assert "staging folder is kept" in str(err.value)
    staging = out / ".staging" / "stopped"
    assert json.loads((staging / "identity.json").read_text()) == json.loads(json.dumps(
        prepare(spec(app, "stopped"), out).identity))
    assert not (out / "stopped.json").exists()


@pytest.mark.slow
def test_a_run_whose_code_changed_after_the_sweep_started_fails_naming_what_changed(tmp_path):
    """The sweep computes the identity once; a run process started later imports what is on disk then."""
    app = make_app(tmp_path / "app")
    server = app / "tinyapp" / "server_app.py"
    edit = ("import pathlib\n"  # an edit of the app between the sweep's start and this run's import
            "with open(pathlib.Path(__file__).with_name('client_app.py'), 'a') as f:\n"
            "    f.write('\\nEDITED_WHILE_THE_SWEEP_RAN = 1\\n')\n")  # code: a comment keeps the digest
    server.write_text(edit + server.read_text())
    with pytest.raises(SweepFailed) as err:
        run_sweep([spec(app, "edited")], tmp_path / "out", progress=lambda line: None)
    assert "RunFailed: the code changed on disk since the sweep started (app.digest: " in str(err.value)
    assert "code.source" not in str(err.value)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []  # no result file, no staging

    from lips_flwr.experiments.runner.worker import check_code

    job = prepare(spec(make_app(tmp_path / "same")), tmp_path / "out")
    check_code(job)  # nothing changed: nothing raised
    then = {**job.identity, "code": {**job.identity["code"], "source": "0" * 64}}
    changed = f"code.source: {'0' * 64} when the sweep started, [0-9a-f]{{64}} now"
    with pytest.raises(RunFailed, match=changed):
        check_code(dataclasses.replace(job, identity=then))


@pytest.mark.slow
def test_a_lips_off_run_of_an_app_without_lips_fails_before_any_client_trains(tmp_path):
    """compare's default arm A forces LIPS off: an app with no LIPS strategy would be the app as written."""
    app = make_app(tmp_path / "app")  # FedAvg, no LIPS
    lines: list[str] = []
    with pytest.raises(SweepFailed) as err:
        run_sweep([spec(app, "a-seed0", lips_off=True)], tmp_path / "out", progress=lines.append)
    assert ("RunFailed: no LIPS strategy was built by the app: the LIPS-off arm would be the app as written; "
            "give each arm its settings with --a/--b") in str(err.value)
    assert not any("round 1" in line for line in lines)  # stopped before its first round's training
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


# --------------------------------------------------------------------------- threads, working folders


def test_jobs_default_to_a_divisor_of_the_runs_and_threads_share_the_cores(monkeypatch):
    from lips_flwr.experiments.runner.slots import default_jobs
    from lips_flwr.experiments.runner.sweep import run_environment

    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)

    assert default_jobs(runs=12, cores=2) == 2 and default_jobs(runs=12, cores=8) == 4  # 4 x 2 threads
    # gcd: jobs x threads is every core (6 jobs of 1 thread on 8 cores, as before, left 2 idle)
    for runs, cores, jobs in ((6, 4, 2), (10, 8, 2), (12, 16, 4), (4, 3, 1), (5, 3, 1)):
        assert default_jobs(runs=runs, cores=cores) == jobs
        assert cores % jobs == 0 and runs % jobs == 0
    assert default_jobs(runs=3, cores=2) == 1  # 2 at a time would leave a core idle for the third run
    assert default_jobs(runs=1, cores=16) == 1 and default_jobs(runs=7, cores=7) == 7
    app_spec = RunSpec("app", "x", 0)
    assert run_environment(app_spec, 3) == {"OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3",
                                            "MKL_NUM_THREADS": "3"}
    studies = RunSpec("app", "x", 0, env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    assert run_environment(studies, 3) == {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "3",
                                           "MKL_NUM_THREADS": "1"}  # a spec's own env wins
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")  # and so does the caller's own setting, for all three
    assert run_environment(app_spec, 3) == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}


@pytest.mark.slow
def test_each_run_works_in_its_own_folder_not_the_callers(tmp_path, monkeypatch):
    """An app's ``open("final-model.txt", "w")`` lands in its run's staging folder, never shared."""
    app = make_app(tmp_path / "app", results=True, save_model=True)
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    out = tmp_path / "out"
    a, b = (read_result(p) for p in run_sweep([spec(app, "a", seed=1), spec(app, "b", seed=2)], out, jobs=2,
                                              progress=lambda line: None))
    assert list(caller.iterdir()) == []  # nothing in the folder the sweep was started from
    assert a.app["cwd"] == str(out / ".staging" / "a") and b.app["cwd"] == str(out / ".staging" / "b")
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "b.json"]  # removed with its staging


def test_a_run_config_path_that_exists_in_the_callers_folder_still_reads_from_the_staging_folder(tmp_path):
    from lips_flwr.experiments.runner.worker import inputs_made_absolute

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.npz").write_bytes(b"")
    (tmp_path / "auto").write_bytes(b"")
    config = {"data-path": "data/train.npz", "out": "model.pt", "score": "sensitivity", "lr": 0.1, "none": "",
              "absolute": "/etc", "resume": "auto"}
    assert inputs_made_absolute(config, tmp_path) == {**config, "data-path": str(tmp_path / "data" / "train.npz")}


def test_a_bare_word_beside_a_folder_of_its_name_is_a_setting_not_a_path(tmp_path):
    """``dataset = "mnist"`` beside ``./mnist/`` was handed to the app as that folder's absolute path."""
    from lips_flwr.experiments.runner.worker import inputs_made_absolute

    (tmp_path / "mnist").mkdir()
    (tmp_path / "resnet").write_bytes(b"")
    config = {"dataset": "mnist", "model": "resnet", "here": ".", "there": "./mnist", "url": "http://x/mnist"}
    assert inputs_made_absolute(config, tmp_path) == {**config, "there": str(tmp_path / "mnist")}


# --------------------------------------------------------------------------- Ray slots (issue 38)


@pytest.mark.slow
def test_runs_compute_at_the_sweeps_own_priority(local_ray):
    """Ray makes its workers 15 steps nicer than the driver by default: beside four busy processes a
    sweep's runs stalled. The local Ray a sweep starts (as this one) gives them the sweep's niceness."""

    @local_ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert local_ray.get(niceness.remote()) == os.nice(0)


@pytest.mark.slow
def test_a_seeds_runs_share_one_slot_group_and_more_jobs_than_cores_share_the_cores(local_ray, tmp_path):
    """Each seed's runs in one placement group; ``--jobs`` above the cores gives each run a fraction of one."""
    from lips_flwr.experiments.runner.dispatch import Plan

    app, out = make_app(tmp_path / "app"), tmp_path / "out"
    jobs = [prepare(spec(app, f"{arm}-seed{s}", seed=s), out) for s in (1, 2, 3) for arm in "ab"]
    cores = int(local_ray.cluster_resources()["CPU"])
    one = Plan.make(jobs, 1, 0.0)
    assert (one.parallel, one.slot, one.threads) == (1, float(cores), cores)
    assert [[[job.name for job in seat] for seat in group] for group in one.groups] == [
        [["a-seed1", "b-seed1"]], [["a-seed2", "b-seed2"]], [["a-seed3", "b-seed3"]]]  # one at a time
    many = Plan.make(jobs, cores + 1, 0.5)
    assert many.parallel == cores + 1 and many.threads == 1 and many.bundle() == {"CPU": many.slot, "GPU": 0.5}
    assert 0 < many.slot < 1 and many.slot * many.parallel <= cores
    assert all(len(group) == 2 for group in many.groups)  # a seed's two arms at once, in one group
    paths = run_sweep([job.spec for job in jobs[:3]], out, jobs=3, progress=lambda line: None)
    assert all(read_result(path).observed["rounds"] for path in paths)


@pytest.mark.slow
def test_a_run_on_a_node_without_the_output_folder_works_in_a_temporary_one_and_says_so(local_ray, tmp_path):
    """A cluster node that does not share ``--out``: the run still returns its result, and one line says
    that, stopped, it would start again at round 1 (its staging folder is not the sweep's)."""
    from lips_flwr.experiments.runner.dispatch import _Mailbox, _task
    from lips_flwr.experiments.runner.worker import Place

    app, out = make_app(tmp_path / "app"), tmp_path / "out"
    job = prepare(spec(app, "far"), out)
    assert not job.staging.exists()  # (never claimed: as the sweep's folder looks from another machine)
    mailbox = _Mailbox.remote()
    place = Place(os.getcwd(), tuple(sys.path), {})
    outcome = local_ray.get(_task.remote(job, False, place, mailbox))
    assert outcome[0] == "done", outcome
    assert outcome[1]["identity"]["run_config"] == job.identity["run_config"]
    assert outcome[1]["observed"]["rounds"]
    events = [event for name, event in local_ray.get(mailbox.take.remote(0.0)) if name == "far"]
    notes = [event[1] for event in events if event[0] == "note"]
    assert len(notes) == 1 and "does not see the output folder" in notes[0]
    assert "stopped, it starts again at round 1" in notes[0]
    assert not out.exists()  # nothing written into the sweep's folder by the run


def test_a_ctrl_c_lost_inside_a_call_is_noted_and_raised_again_and_an_ignored_one_stays_ignored():
    """A ``KeyboardInterrupt`` swallowed inside a call (as one Ray call did, once, in a loaded CI) is
    raised again by the sweep's loop; the handler before is back after; SIGINT ignored stays ignored."""
    import signal

    from lips_flwr.experiments.runner.sweep import _CtrlC

    before = signal.getsignal(signal.SIGINT)
    ctrl_c = _CtrlC()
    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
        pass  # (swallowed, as by the library call it interrupted)
    with pytest.raises(KeyboardInterrupt):
        ctrl_c.check()
    ctrl_c.close()
    assert signal.getsignal(signal.SIGINT) is before
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ignoring = _CtrlC()
        os.kill(os.getpid(), signal.SIGINT)  # (ignored: nothing is raised)
        ignoring.check()
        ignoring.close()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
