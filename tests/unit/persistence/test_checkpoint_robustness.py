"""The checkpoint cannot be corrupted by a second writer, another run or hostile contents.

Issue "No client can end a run, nothing is silently corrupted", checkpoint side:

1. two writers on one checkpoint: one writer at a time (a lock taken at the
   start of the run, freed when its process dies); temporaries are removed only
   when their writer is gone;
2. run identity: a checkpoint remembers the initial model of the run that wrote
   it, and a resume from another run's checkpoint is refused; a fresh run does
   not overwrite a file that is not a LIPS checkpoint;
3. every restored value is checked against the live settings and the model's
   shapes before round 1;
4. the metrics history is appended to a sidecar file: the bytes a save writes
   do not grow with the run.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from unittest.mock import Mock

import numpy as np
import pytest
from flower_fakes import task_identity, tiny_model, to_numpy, to_record  # noqa: F401
from flwr.common import ndarrays_to_parameters
from flwr.server.strategy import FedAvgM as LegacyFedAvgM
from flwr.serverapp.strategy import FedAvg
from test_resume import (
    CRASH_AT,
    LEGACY_INNER,
    LIPS_KW,
    MAKE,
    NAMES,
    ROUNDS,
    SAMPLING,
    Crash,
    comparable,
    message_grid,
    rewrite,
    run_legacy,
    run_message,
)

from lips_flwr.core.layers import candidate_names
from lips_flwr.core.lips import LIPSCore
from lips_flwr.persistence.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from lips_flwr.persistence.identity import model_fingerprint
from lips_flwr.strategies import LIPS, LegacyLIPS
from lips_flwr.strategies.resume.keeper import CheckpointKeeper
from lips_flwr.strategies.codecs import MessageCodec

REPO = Path(__file__).resolve().parents[3]
ndarray_state = MessageCodec().to_arrays  # plain numpy state, as the strategies' codecs read it


# ----- helpers: writers in other processes -----

WRITER = r"""
import json, sys, time
from pathlib import Path
import numpy as np
path, mode, saves, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
model = {"w": np.arange(64 * 64, dtype=np.float32).reshape(64, 64)}

def wait(name):
    while not (folder / name).exists():
        time.sleep(0.005)

failed = []
if mode == "raw":  # save_checkpoint itself, no keeper: as two runs did before the lock
    from lips_flwr.persistence.checkpoint import Checkpoint, save_checkpoint
    wait("go")
    for r in range(1, saves + 1):
        try:
            save_checkpoint(path, Checkpoint(round=r, num_rounds=saves, settings={}, model=model))
        except Exception as err:
            failed.append(repr(err))
else:  # a strategy's keeper: begin() at the start of the run, a save per round
    from lips_flwr.core.lips import LIPSCore
    from lips_flwr.strategies.resume.keeper import CheckpointKeeper
    from lips_flwr.strategies.codecs import MessageCodec
    ndarray_state = MessageCodec().to_arrays

    class Owner:
        pass

    owner, core, keeper = Owner(), LIPSCore(num_rounds=saves), CheckpointKeeper(path, False)
    try:
        keeper.begin(owner, core)
    except ValueError as err:
        (folder / "refused").write_text(str(err))
        sys.exit(0)
    (folder / "ready").write_text("")
    wait("go")
    for r in range(0, saves + 1):
        try:
            keeper.save(owner, core, r, model, ndarray_state)
        except Exception as err:
            failed.append(repr(err))
(folder / ("done-" + str(__import__("os").getpid()))).write_text(json.dumps(failed))
"""


def writer(path: Path, mode: str, saves: int, folder: Path) -> subprocess.Popen:
    folder.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), mode, str(saves), str(folder)],
                            cwd=REPO, env=env)


def wait_for(path: Path, proc: subprocess.Popen | None = None, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc is None or proc.poll() is None or path.exists(), f"the writer exited ({proc.returncode})"
        assert time.monotonic() < end, f"no {path.name} after {timeout} s"
        time.sleep(0.01)


def failures(folder: Path) -> list:
    return [f for done in folder.glob("done-*") for f in json.loads(done.read_text())]


class Owner:
    """A strategy chain of one with no state: what a keeper needs of its owner."""


def keeper_run(path, resume=False, num_rounds=ROUNDS) -> tuple[CheckpointKeeper, Owner, LIPSCore]:
    keeper, owner, core = CheckpointKeeper(path, resume), Owner(), LIPSCore(num_rounds=num_rounds)
    keeper.begin(owner, core)
    return keeper, owner, core


# ----- 1. two writers on one checkpoint -----

@pytest.mark.slow
def test_two_processes_saving_one_checkpoint_lose_no_save(tmp_path):
    """Before: each save removed the other's temporary file as stale (FileNotFoundError)."""
    path, folder = tmp_path / "lips.npz", tmp_path / "sync"
    procs = [writer(path, "raw", 60, folder) for _ in range(2)]
    (folder / "go").write_text("")
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    assert failures(folder) == []
    assert load_checkpoint(path).round == 60
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".lips.npz.")]


@pytest.mark.slow
def test_a_second_run_on_a_checkpoint_in_use_is_refused_at_begin(tmp_path):
    path, folder = tmp_path / "lips.npz", tmp_path / "sync"
    first = writer(path, "keeper", 30, folder)
    wait_for(folder / "ready", first)
    # Another process (this one): refused at begin(), not waiting, naming the file.
    with pytest.raises(ValueError, match=r"checkpoint '.*lips\.npz' is in use: another run is writing it"):
        keeper_run(path)
    with pytest.raises(ValueError, match="another run is writing"):
        keeper_run(path, resume="auto")
    second = writer(path, "keeper", 30, tmp_path / "sync2")  # and a third process
    assert second.wait(timeout=60) == 0
    assert "another run is writing" in (tmp_path / "sync2" / "refused").read_text()
    (folder / "go").write_text("")
    assert first.wait(timeout=60) == 0
    assert failures(folder) == []  # the first run lost no save
    assert load_checkpoint(path).round == 30
    keeper, _, _ = keeper_run(path, resume=True, num_rounds=30)  # its process is gone: free again
    assert keeper.saved_round == 30


def test_a_second_keeper_in_another_thread_is_refused(tmp_path):
    path = tmp_path / "lips.npz"
    first, owner, core = keeper_run(path)
    first.save(owner, core, 1, tiny_model(), ndarray_state)
    errors: list = []

    def second() -> None:
        try:
            keeper_run(path, resume="auto")
        except ValueError as err:
            errors.append(str(err))

    thread = threading.Thread(target=second)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "another run is writing" in errors[0] and str(path) in errors[0]
    first.save(owner, core, 2, tiny_model(), ndarray_state)  # the first run goes on
    assert load_checkpoint(path).round == 2


def test_a_killed_writer_leaves_no_lock_behind(tmp_path):
    path, folder = tmp_path / "lips.npz", tmp_path / "sync"
    proc = writer(path, "keeper", 5, folder)
    wait_for(folder / "ready", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    keeper, owner, core = keeper_run(path)  # the OS freed the dead writer's lock
    keeper.save(owner, core, 1, tiny_model(), ndarray_state)
    assert load_checkpoint(path).round == 1


def test_a_run_restarted_in_the_same_thread_takes_over_and_the_old_one_cannot_write(tmp_path):
    """A crashed run's strategy may outlive the crash (a traceback, a notebook): its thread may restart."""
    path = tmp_path / "lips.npz"
    old, owner, core = keeper_run(path)
    old.save(owner, core, 1, tiny_model(), ndarray_state)
    new, owner2, core2 = keeper_run(path, resume=True)
    assert new.saved_round == 1
    with pytest.raises(ValueError, match="another run"):
        old.save(owner, core, 2, tiny_model(), ndarray_state)
    new.save(owner2, core2, 2, tiny_model(), ndarray_state)
    assert load_checkpoint(path).round == 2


def test_only_the_temporaries_of_writers_that_are_gone_are_removed(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        live = tmp_path / f".lips.npz.{sleeper.pid}.k3j2h1ab"  # another writer, mid-write
        gone = tmp_path / f".lips.npz.{dead.pid}.zz9x8y7w"  # a writer killed mid-write
        mine = tmp_path / f".lips.npz.{os.getpid()}.aa1b2c3d"  # this process's, left by a crash
        for p in (live, gone, mine):
            p.write_bytes(b"half a checkpoint")
        save_checkpoint(tmp_path / "lips.npz", Checkpoint(round=1, num_rounds=2, settings={},
                                                          model=tiny_model()))
        assert live.exists() and not gone.exists() and not mine.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


# ----- 2. run identity -----

def start(make, model, crash_at=None, seed=7):
    sampled: list = []
    random.seed(seed)
    np.random.seed(seed)
    result = make().start(grid=message_grid(sampled, crash_at), initial_arrays=to_record(model),
                          num_rounds=ROUNDS)
    return result, sampled


def test_resume_refuses_the_checkpoint_of_another_run(tmp_path, task_identity, caplog):
    path = tmp_path / "lips.npz"
    make = MAKE["FedAvgM"]
    with pytest.raises(Crash):  # run A
        start(lambda: make(checkpoint_path=path), tiny_model(0), crash_at=CRASH_AT)
    key_a = load_checkpoint(path).run_key
    with caplog.at_level(logging.WARNING), pytest.raises(Crash):  # run B, same path, another model
        start(lambda: make(checkpoint_path=path), tiny_model(1), crash_at=3)
    assert f"replaces the LIPS checkpoint {str(path)!r}" in caplog.text and key_a in caplog.text
    sampled: list = []
    with pytest.raises(ValueError, match=r"was written by another run \(its initial model differs"):
        make(checkpoint_path=path, resume=True).start(
            grid=message_grid(sampled), initial_arrays=to_record(tiny_model(0)), num_rounds=ROUNDS)
    assert sampled == []
    # B itself resumes.
    start(lambda: make(checkpoint_path=path, resume=True), tiny_model(1))
    assert load_checkpoint(path).round == ROUNDS


def test_the_run_identity_is_the_initial_model_for_the_whole_run(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    seen = []
    strategy = MAKE["FedAvg"](checkpoint_path=path)
    original = strategy._save_checkpoint

    def spy(server_round, model):
        original(server_round, model)
        if path.exists():
            seen.append(load_checkpoint(path).identity)

    strategy._save_checkpoint = spy
    start(lambda: strategy, tiny_model(0))
    expected = model_fingerprint(tiny_model(0))
    assert len(seen) >= ROUNDS and all(i["initial_model"] == expected for i in seen)
    assert expected["names"] == NAMES and len(expected["sha256"]) == 64
    assert seen[-1]["settings"] == strategy.core.settings()
    assert model_fingerprint(tiny_model(1))["sha256"] != expected["sha256"]


def test_legacy_resume_refuses_the_checkpoint_of_another_run(tmp_path):
    path = tmp_path / "lips.npz"
    with pytest.raises(Crash):
        run_legacy("FedAvgM", crash_at=CRASH_AT, checkpoint_path=path)  # initial model: tiny_model(0)

    def resumed(seed):
        inner = LegacyFedAvgM(server_momentum=0.9, **SAMPLING,
                              initial_parameters=ndarrays_to_parameters(list(tiny_model(seed).values())))
        return LegacyLIPS(inner, param_names=NAMES, num_rounds=ROUNDS, checkpoint_path=path, resume=True,
                          **LIPS_KW)

    with pytest.raises(ValueError, match=r"written by another run \(its initial model differs: the same "
                                         r"names, shapes and dtypes, other values"):
        resumed(1).initialize_parameters(Mock())
    assert resumed(0).initialize_parameters(Mock()) is not None


def test_a_fresh_run_does_not_overwrite_a_file_that_is_not_a_checkpoint(tmp_path, task_identity):
    path = tmp_path / "results.json"
    path.write_text('{"accuracy": 0.93}')
    sampled: list = []
    with pytest.raises(ValueError, match=r"results\.json.*not a LIPS checkpoint"):
        LIPS(FedAvg(), checkpoint_path=path, **LIPS_KW).start(
            grid=message_grid(sampled), initial_arrays=to_record(tiny_model()), num_rounds=ROUNDS)
    with pytest.raises(ValueError, match=r"results\.json.*not a LIPS checkpoint"):
        LegacyLIPS(LEGACY_INNER["FedAvgM"](None, None), param_names=NAMES, num_rounds=ROUNDS,
                   checkpoint_path=path, **LIPS_KW)
    assert sampled == [] and path.read_text() == '{"accuracy": 0.93}'
    # Nor is the lock of a refused run kept: the path can be used once the file is moved.
    path.unlink()
    start(lambda: LIPS(FedAvg(), checkpoint_path=path, **LIPS_KW), tiny_model())
    assert load_checkpoint(path).round == ROUNDS


# ----- 3. restored values are checked against the live settings and shapes -----

def crashed_checkpoint(path, make=MAKE["FedAvgM"]):
    with pytest.raises(Crash):
        start(lambda: make(checkpoint_path=path), tiny_model(), crash_at=CRASH_AT)


def refused_resume(path, make, match):
    sampled: list = []
    with pytest.raises(ValueError, match=match):
        make(checkpoint_path=path, resume=True).start(
            grid=message_grid(sampled), initial_arrays=to_record(tiny_model()), num_rounds=ROUNDS)
    assert sampled == []  # before any round


def test_a_saved_layer_choice_other_than_the_live_one_is_refused(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    crashed_checkpoint(path)
    assert load_checkpoint(path).layers == ["conv2.weight", "conv3.weight"]
    rewrite(path, lambda g, m: m.update(layers=["conv1.weight", "conv2.weight", "conv3.weight"]))
    refused_resume(path, MAKE["FedAvgM"], r"layer choice .*conv1\.weight.*layers='middle' selects")


def test_a_saved_layer_the_model_lacks_is_refused(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    crashed_checkpoint(path)
    rewrite(path, lambda g, m: m.update(layers=["conv2.weight", "nope.weight"]))
    refused_resume(path, MAKE["FedAvgM"], r"'nope\.weight'.*model lacks|model lacks.*'nope\.weight'")


def _rename(arrays: dict, old: str, new: str) -> dict:
    return {(new if n == old else n): a for n, a in arrays.items()}


@pytest.mark.parametrize("edit", [
    # The reference model names a tensor the model lacks.
    lambda g, m: g.update({"inertia-reference": _rename(g["inertia-reference"], "conv2.weight", "x")}),
    # The previous model (stored apart) with other shapes.
    lambda g, m: (g.update({"inertia-previous": {n: np.zeros((2, 2), np.float32)
                                                 for n in candidate_names(g["model"])}}),
                  m["inertia"].update(previous=True)),
    # A reference model that lacks a tracked tensor.
    lambda g, m: g["inertia-reference"].pop("conv3.weight"),
], ids=["unknown-name", "other-shapes", "missing-name"])
def test_an_inertia_series_that_does_not_fit_the_model_is_refused(tmp_path, task_identity, edit):
    path = tmp_path / "lips.npz"
    crashed_checkpoint(path)
    rewrite(path, edit)
    refused_resume(path, MAKE["FedAvgM"], "inertia")


def test_array_state_that_does_not_fit_the_model_is_refused(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    crashed_checkpoint(path)
    keys = [k for k in load_checkpoint(path).strategy if k.endswith("momentum_vector")]
    assert keys == ["1.FedAvgM.momentum_vector"]

    def edit(g, m):
        group = g["strategy-1.FedAvgM.momentum_vector"]
        for name in group:
            group[name] = np.zeros(3, dtype=np.float32)

    rewrite(path, edit)
    refused_resume(path, MAKE["FedAvgM"], r"1\.FedAvgM\.momentum_vector.*does not fit")


DP = "DP-adaptive(FedAvgM)"
NORM = "1.DifferentialPrivacyServerSideAdaptiveClipping.clipping_norm"


@pytest.mark.parametrize("value", [[1.0, 2.0], "wide", {"a": 1}, True])
def test_a_saved_value_of_another_type_is_refused(tmp_path, task_identity, value):
    path = tmp_path / "lips.npz"
    crashed_checkpoint(path, MAKE[DP])
    assert isinstance(load_checkpoint(path).strategy_meta["scalars"][NORM], float)
    rewrite(path, lambda g, m: m["strategy_meta"]["scalars"].update({NORM: value}))
    refused_resume(path, MAKE[DP], "clipping_norm")


@pytest.mark.parametrize(("chain", "key"), [("FedAvg", "1.FedAvg.arrayrecord_key"),
                                            (DP, "2.FedAvgM.arrayrecord_key"), (DP, "2.FedAvgM.weighted_by_key")])
def test_a_hostile_text_value_is_refused_before_round_1(tmp_path, task_identity, chain, key):
    """Issue 28, 8: before, ``arrayrecord_key='x'`` was restored with a WARNING and round 1 failed with
    ``KeyError: 'arrays'``. Text a strategy does not declare as its state is a setting (a record or
    metric name): since issue 36 it is refused, as all undeclared state, by name with the
    ``lips_state`` fix (before, as text "not written by this strategy chain")."""
    path = tmp_path / "lips.npz"
    crashed_checkpoint(path, MAKE[chain])
    rewrite(path, lambda g, m: m["strategy_meta"]["scalars"].update({key: "x"}))
    refused_resume(path, MAKE[chain],
                   rf"holds {re.escape(key)}, which the wrapped strategies do not declare.*lips_state")


def test_each_restored_value_is_named_in_a_warning(tmp_path, task_identity, caplog):
    """Issue 36 changed this test: it restored an undeclared setting (``2.FedAvgM.fraction_train``,
    as a checkpoint written before the declared state held it) behind this warning. Only declared
    state is restored now: that checkpoint is refused, or, with ``skip_undeclared_state=True``,
    the setting is skipped and named in a warning of its own."""
    path = tmp_path / "lips.npz"
    crashed_checkpoint(path, MAKE[DP])
    rewrite(path, lambda g, m: m["strategy_meta"]["scalars"].update({NORM: 0.125}))
    with caplog.at_level(logging.WARNING):
        start(lambda: MAKE[DP](checkpoint_path=path, resume=True), tiny_model())
    restored = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "restoring" in r.getMessage()]
    assert restored and f"{NORM} = 0.125" in restored[0]

    crashed_checkpoint(path, MAKE[DP])
    rewrite(path, lambda g, m: m["strategy_meta"]["scalars"].update({"2.FedAvgM.fraction_train": 0.25}))
    refused_resume(path, MAKE[DP], r"holds 2\.FedAvgM\.fraction_train, which the wrapped strategies do not "
                   r"declare.*FedAvgM\.lips_state.*skip_undeclared_state=True")
    caplog.clear()
    resumed = MAKE[DP](checkpoint_path=path, resume=True, skip_undeclared_state=True)
    with caplog.at_level(logging.WARNING):
        start(lambda: resumed, tiny_model())
    assert resumed.strategy.strategy.fraction_train == 0.5  # as built
    skipped = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(skipped) == 1 and "2.FedAvgM.fraction_train" in skipped[0]
    assert not any("fraction_train" in r.getMessage() for r in caplog.records if "restoring" in r.getMessage())


def test_deeply_nested_metadata_is_a_value_error(tmp_path):
    path = tmp_path / "lips.npz"
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    np.savez(path, __meta__=np.frombuffer(deep, dtype=np.uint8))
    with pytest.raises(ValueError, match="not a readable LIPS checkpoint"):
        load_checkpoint(path)


# ----- 4. the history: O(T) bytes over a run -----

def round_metrics(r: int, layers: int = 40) -> dict:
    metrics = {"lips-mask-round": r % 5 == 1, "lips-tau": 0.5, "lips-seconds": 0.01 * r}
    for i in range(layers):
        metrics[f"lips-zeros/layer{i}.weight"] = 1000 + r
        metrics[f"inertia-cos-t0/layer{i}.weight"] = 0.99
        metrics[f"inertia-step/layer{i}.weight"] = 0.01
    return {k: int(v) if isinstance(v, bool) else v for k, v in metrics.items()}


def test_history_bytes_written_per_round_do_not_grow_with_the_run(tmp_path):
    path = tmp_path / "lips.npz"
    keeper, owner, core = keeper_run(path, num_rounds=120)
    history: dict = {"train": {}, "evaluate": {}, "server": {}}
    model = {"w": np.ones((8, 8), np.float32)}
    sidecar = tmp_path / "lips.npz.history.jsonl"
    written = {}
    for r in range(0, 101):
        before = sidecar.stat().st_size if sidecar.exists() else 0
        keeper.save(owner, core, r, model, ndarray_state, history)
        after = sidecar.stat().st_size if sidecar.exists() else 0
        if path.exists():
            written[r] = path.stat().st_size + (after - before)  # what this save wrote
        history["train"][r + 1] = round_metrics(r + 1)
        history["evaluate"][r + 1] = {"acc": 0.5, "num-examples": 10}
    assert written[100] <= 1.05 * written[10] + 256, (written[10], written[100])
    # And all of it is read back.
    loaded = load_checkpoint(path)
    assert loaded.round == 100 and sorted(int(r) for r in loaded.history["train"]) == list(range(1, 101))
    assert loaded.history["train"]["100"] == round_metrics(100)


def test_the_history_ignores_lines_past_the_checkpoint_and_a_truncated_last_line(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    whole, _, _ = run_message(MAKE["FedAvg"])
    with pytest.raises(Crash):
        run_message(lambda: MAKE["FedAvg"](checkpoint_path=path), crash_at=CRASH_AT)
    sidecar = tmp_path / "lips.npz.history.jsonl"
    good = sidecar.stat().st_size
    with open(sidecar, "a") as f:  # a save that was cut short after appending, then a torn line
        f.write(json.dumps({"part": "train", "round": CRASH_AT, "metrics": {"bogus": 1.0}}) + "\n")
        f.write('{"part": "train", "round": 2, "metr')
    loaded = load_checkpoint(path)
    assert str(CRASH_AT) not in loaded.history["train"]
    resumed, _, _ = run_message(lambda: MAKE["FedAvg"](checkpoint_path=path, resume=True), seed=12345)
    for r, metrics in whole.train_metrics_clientapp.items():
        assert comparable(resumed.train_metrics_clientapp[r]) == comparable(metrics), r
    assert "bogus" not in sidecar.read_text()  # the resumed run cut the file back to its checkpoint
    assert sidecar.stat().st_size > good


def test_a_missing_history_file_is_named_and_the_run_resumes(tmp_path, task_identity, caplog):
    path = tmp_path / "lips.npz"
    with pytest.raises(Crash):
        run_message(lambda: MAKE["FedAvg"](checkpoint_path=path), crash_at=CRASH_AT)
    (tmp_path / "lips.npz.history.jsonl").unlink()
    with caplog.at_level(logging.WARNING):
        resumed, _, _ = run_message(lambda: MAKE["FedAvg"](checkpoint_path=path, resume=True))
    assert "lips.npz.history.jsonl' is missing" in caplog.text
    assert sorted(resumed.train_metrics_clientapp) == list(range(CRASH_AT, ROUNDS + 1))
    final = load_checkpoint(path)  # a new history file, whole
    assert sorted(map(int, final.history["train"])) == list(range(CRASH_AT, ROUNDS + 1))
    assert final.notes == []


def test_a_history_file_deleted_during_a_run_is_written_anew(tmp_path):
    path = tmp_path / "lips.npz"
    keeper, owner, core = keeper_run(path)
    history: dict = {"train": {}}
    for r in range(0, ROUNDS + 1):
        if r == 4:
            (tmp_path / "lips.npz.history.jsonl").unlink()
        keeper.save(owner, core, r, tiny_model(), ndarray_state, history)
        history["train"][r + 1] = round_metrics(r + 1, layers=2)
    assert sorted(map(int, load_checkpoint(path).history["train"])) == list(range(1, ROUNDS + 1))


def test_a_checkpoint_with_its_history_inline_is_continued_in_the_history_file(tmp_path):
    """Version 1 checkpoints held the history in the .npz: they are read, and continued."""
    path = tmp_path / "lips.npz"
    core = LIPSCore(num_rounds=ROUNDS)
    old = Checkpoint(round=3, num_rounds=ROUNDS, settings=core.settings(), model=tiny_model(),
                     run_key="a" * 32, history={"train": {str(r): round_metrics(r, 2) for r in (1, 2, 3)}})
    save_checkpoint(path, old)
    rewrite(path, lambda g, m: m.update(version=1))
    keeper, owner, core = keeper_run(path, resume=True)
    loaded = load_checkpoint(path)
    assert loaded.history == old.history and loaded.history_bytes is None
    history = {"train": {int(r): m for r, m in loaded.history["train"].items()}}
    history["train"][4] = round_metrics(4, 2)
    keeper.save(owner, core, 4, tiny_model(), ndarray_state, history)
    again = load_checkpoint(path)
    assert again.history_bytes is not None and sorted(map(int, again.history["train"])) == [1, 2, 3, 4]


def test_a_damaged_history_line_is_a_value_error(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    run_message(lambda: MAKE["FedAvg"](checkpoint_path=path))
    sidecar = tmp_path / "lips.npz.history.jsonl"
    lines = sidecar.read_text().splitlines(keepends=True)
    entry = json.loads(lines[1])
    entry["metrics"]["x"] = "NaN text"
    lines[1] = json.dumps(entry) + "\n"
    sidecar.write_text("".join(lines))
    with pytest.raises(ValueError, match="not a number"):
        load_checkpoint(path)


@pytest.mark.parametrize("frozen", [False, True], ids=["collected", "frozen-then-collected"])
def test_a_crashed_runs_strategy_in_a_reference_cycle_gives_its_lock_up(tmp_path, frozen):
    """Its thread lives on (a notebook's, a server's), the strategy is garbage in a cycle, not collected
    yet; frozen with the objects the process held (``gc.freeze()``: a batched run freezes them)."""
    from lips_flwr.persistence.lock import lock_checkpoint

    path, made, done = tmp_path / "lips.npz", threading.Event(), threading.Event()
    held: list = []

    def crashed_run() -> None:
        strategy: list = [lock_checkpoint(path)]
        strategy.append(strategy)  # the cycle: only a full collection frees it
        held.append(weakref.ref(strategy[0]))
        del strategy
        made.set()
        done.wait(60)  # the thread lives on

    gc.disable()  # (no collection of its own before the lock is asked for)
    thread = threading.Thread(target=crashed_run)
    thread.start()
    try:
        assert made.wait(60)
        if frozen:
            gc.freeze()
        assert held[0]() is not None and held[0]().held  # garbage, not collected, its lock held
        lock = lock_checkpoint(path)
        assert lock.held and held[0]() is None
        lock.release()
    finally:
        if frozen:
            gc.unfreeze()
        gc.enable()
        done.set()
        thread.join()
