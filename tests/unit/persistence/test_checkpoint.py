"""The checkpoint file: round trip, atomic write, clear errors (no Flower involved)."""

from __future__ import annotations

import os
import random
import zipfile

import numpy as np
import pytest

from lips_flwr.persistence import checkpoint as ckpt
from lips_flwr.persistence import random_state
from lips_flwr.persistence.checkpoint import (
    Checkpoint,
    checkpoint_to_resume,
    load_checkpoint,
    save_checkpoint,
    settings_mismatch,
    validate_resume,
)
from lips_flwr.core.inertia import InertiaTracker
from lips_flwr.core.layers import candidate_names
from lips_flwr.core.lips import LIPSCore
from lips_flwr.strategies.resume.core_state import checkpoint_of, continue_schedule


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "conv1.weight": rng.normal(size=(4, 1, 3, 3)).astype(np.float32),
        "bn1.num_batches_tracked": np.array(7, dtype=np.int64),  # 0-d
        "conv2.weight": rng.normal(size=(8, 4, 3, 3)).astype(np.float16),
        "fc.weight": rng.normal(size=(10, 8)),  # float64
    }


def full_checkpoint() -> Checkpoint:
    return Checkpoint(
        round=4, num_rounds=10,
        settings=LIPSCore(num_rounds=10, inertia_t0=2).settings(),
        model=model(0), layers=["conv2.weight"],
        inertia={"t0": 2, "reference": {"conv2.weight": model(1)["conv2.weight"]}, "previous": None},
        strategy={"0.FedAvgM.momentum_vector": ("list", {"0": np.ones(3), "1": np.float32(2.0)}),
                  "1.FedAdam.m_t": ("dict", {"a": np.zeros((2, 2))})},
        python_random=random_state.python_random_state(),
    )


def test_round_trip_keeps_order_dtypes_shapes_and_values(tmp_path):
    saved = full_checkpoint()
    save_checkpoint(tmp_path / "sub" / "lips.npz", saved)
    loaded = load_checkpoint(tmp_path / "sub" / "lips.npz")
    assert (loaded.round, loaded.num_rounds, loaded.layers) == (4, 10, ["conv2.weight"])
    assert loaded.settings == saved.settings
    assert list(loaded.model) == list(saved.model)
    for name, array in saved.model.items():
        assert loaded.model[name].dtype == array.dtype and loaded.model[name].shape == array.shape
        np.testing.assert_array_equal(loaded.model[name], array)
    assert loaded.inertia["t0"] == 2 and loaded.inertia["previous"] is None
    np.testing.assert_array_equal(loaded.inertia["reference"]["conv2.weight"],
                                  saved.inertia["reference"]["conv2.weight"])
    kind, arrays = loaded.strategy["0.FedAvgM.momentum_vector"]
    assert kind == "list" and arrays["1"].shape == () and arrays["1"] == np.float32(2.0)
    assert loaded.strategy["1.FedAdam.m_t"][0] == "dict"
    assert loaded.python_random == saved.python_random


def test_python_random_state_round_trips_through_the_file(tmp_path):
    random.seed(3)
    saved = full_checkpoint()  # captures random's state now
    save_checkpoint(tmp_path / "c.npz", saved)
    expected = [random.random() for _ in range(5)]
    random.seed(99)
    random_state.restore_python_random(load_checkpoint(tmp_path / "c.npz").python_random)
    assert [random.random() for _ in range(5)] == expected


def test_failed_write_keeps_the_previous_checkpoint_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "lips.npz"
    first = full_checkpoint()
    save_checkpoint(path, first)
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    second = full_checkpoint()
    second.round = 5
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, second)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lips.npz"]
    assert load_checkpoint(path).round == 4


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no LIPS checkpoint"):
        load_checkpoint(tmp_path / "nope.npz")


def test_truncated_file_is_a_clear_value_error(tmp_path):
    path = tmp_path / "lips.npz"
    save_checkpoint(path, full_checkpoint())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable LIPS checkpoint"):
        load_checkpoint(path)


def test_other_files_are_refused(tmp_path):
    text = tmp_path / "notes.npz"
    text.write_text("hello")
    with pytest.raises(ValueError, match="not a readable LIPS checkpoint"):
        load_checkpoint(text)
    plain = tmp_path / "plain.npz"
    np.savez(plain, x=np.ones(3))  # a valid npz without LIPS metadata
    with pytest.raises(ValueError, match="not a readable LIPS checkpoint"):
        load_checkpoint(plain)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, __meta__=np.array([{"format": "x"}], dtype=object))
    with pytest.raises(ValueError, match="not a readable LIPS checkpoint"):
        load_checkpoint(pickled)  # allow_pickle=False: object arrays are never loaded


def test_other_version_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "lips.npz"
    monkeypatch.setattr(ckpt, "VERSION", 99)
    save_checkpoint(path, full_checkpoint())
    monkeypatch.setattr(ckpt, "VERSION", 1)
    with pytest.raises(ValueError, match="version 99"):
        load_checkpoint(path)


def test_missing_array_is_reported_as_damage(tmp_path):
    path = tmp_path / "lips.npz"
    save_checkpoint(path, full_checkpoint())
    damaged = tmp_path / "damaged.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(damaged, "w") as dst:
        for item in src.infolist():
            if item.filename != "model/2.npy":
                dst.writestr(item, src.read(item.filename))
    with pytest.raises(ValueError, match="damaged.*'model'"):
        load_checkpoint(damaged)


@pytest.mark.parametrize("path, resume, match", [
    (None, True, "needs `checkpoint_path`"),
    (None, "auto", "needs `checkpoint_path`"),
    ("x.npz", "yes", "`resume` must be one of"),
    ("x.npz", 1, "`resume` must be one of"),
    ("", False, "must not be empty"),
    (3, False, "`checkpoint_path` must be a path"),
])
def test_bad_resume_arguments(path, resume, match):
    with pytest.raises(ValueError, match=match):
        validate_resume(path, resume)


def test_resume_modes(tmp_path):
    path = str(tmp_path / "lips.npz")
    assert checkpoint_to_resume(path, False) is None
    assert checkpoint_to_resume(path, "auto") is None  # no file yet: start at round 1
    with pytest.raises(FileNotFoundError):
        checkpoint_to_resume(path, True)
    save_checkpoint(path, full_checkpoint())
    assert checkpoint_to_resume(path, "auto").round == 4
    assert checkpoint_to_resume(path, True).round == 4
    assert checkpoint_to_resume(path, False) is None


def test_settings_mismatch_names_each_difference():
    saved = LIPSCore(num_rounds=10, tau0=0.5, layers=("a", "b")).settings()
    now = LIPSCore(num_rounds=10, tau0=0.7, every=3, layers=["a", "b"]).settings()
    problems = settings_mismatch(saved, now)
    assert problems == ["every: checkpoint 5, now 3", "tau0: checkpoint 0.5, now 0.7"]


def test_core_resume_refuses_other_settings_or_horizon():
    checkpoint = checkpoint_of(LIPSCore(num_rounds=10), 3, model())
    with pytest.raises(ValueError, match="tau0: checkpoint 0.5, now 0.6"):
        continue_schedule(LIPSCore(num_rounds=10, tau0=0.6), checkpoint)
    with pytest.raises(ValueError, match="num_rounds: checkpoint 10, now 12"):
        continue_schedule(LIPSCore(num_rounds=12), checkpoint)
    later = LIPSCore()  # T not known yet: taken from the checkpoint
    continue_schedule(later, checkpoint)
    assert later.num_rounds == 10


def observe(core, server_round, model):
    """Feed the core's inertia tracker as a round does (on the unmasked aggregate)."""
    return core.inertia.update(server_round, model, candidate_names(model))


def test_core_resume_keeps_the_layer_choice_and_inertia_series():
    first = LIPSCore(num_rounds=10, layers="all", inertia_t0=1)
    m = model()
    first.layer_names(m)
    observe(first, 1, m)
    observe(first, 2, model(1))
    checkpoint = checkpoint_of(first, 2, model(1))
    second = LIPSCore(num_rounds=10, layers="all", inertia_t0=1)
    continue_schedule(second, checkpoint)
    assert second.layer_names(m) == first.layer_names(m)
    assert observe(second, 3, model(2)) == observe(first, 3, model(2))


def test_inertia_tracker_refuses_another_t0():
    with pytest.raises(ValueError, match="t0=2"):
        InertiaTracker(3).load_state({"t0": 2, "reference": None, "previous": None})


def test_inertia_tensors_equal_to_the_model_are_stored_once(tmp_path):
    saved = full_checkpoint()
    saved.inertia = {"t0": 2, "reference": {"fc.weight": model(5)["fc.weight"]},
                     "previous": {n: saved.model[n].copy() for n in ("conv2.weight", "fc.weight")}}
    save_checkpoint(tmp_path / "c.npz", saved)
    with np.load(tmp_path / "c.npz") as npz:
        assert not [f for f in npz.files if f.startswith("inertia-previous")]
        assert [f for f in npz.files if f.startswith("inertia-reference")] == ["inertia-reference/0"]
    loaded = load_checkpoint(tmp_path / "c.npz")
    for name in ("conv2.weight", "fc.weight"):
        assert loaded.inertia["previous"][name].dtype == saved.model[name].dtype
        np.testing.assert_array_equal(loaded.inertia["previous"][name], saved.model[name])
    np.testing.assert_array_equal(loaded.inertia["reference"]["fc.weight"], model(5)["fc.weight"])
    # A previous model that differs in one value (or in dtype) is stored as it is.
    saved.inertia["previous"]["fc.weight"] = saved.model["fc.weight"].astype(np.float32)
    save_checkpoint(tmp_path / "d.npz", saved)
    loaded = load_checkpoint(tmp_path / "d.npz")
    assert loaded.inertia["previous"]["fc.weight"].dtype == np.float32


def test_a_temporary_file_left_by_a_crash_goes_with_the_next_save(tmp_path):
    (tmp_path / ".lips.npz.k3j2h1").write_bytes(b"half a checkpoint")  # a SIGKILL mid-write
    (tmp_path / "other.npz").write_bytes(b"not ours")
    save_checkpoint(tmp_path / "lips.npz", full_checkpoint())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lips.npz", "other.npz"]
