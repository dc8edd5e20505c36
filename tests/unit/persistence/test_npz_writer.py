"""``write_npz`` writes what ``np.savez`` writes (issue 39: a client state file's save without zipfile).

The members, their order and their ``.npy`` bytes equal ``np.savez``'s for
every kind of array a checkpoint or a client's state holds, and some it does
not (Fortran order, strided, 0-d, empty, strings, a non-ASCII name); zipfile
finds every CRC right, verifies it when reading, and equal arrays give equal
files. Past the plain zip format's limits the archive is ``np.savez``'s own.
"""

from __future__ import annotations

import zipfile
from io import BytesIO

import numpy as np
import pytest

from lips_flwr._npy import npy_bytes, npy_parts
from lips_flwr.persistence import npz_writer
from lips_flwr.persistence.npz_writer import write_npz


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "model/0": rng.standard_normal((16, 8, 3, 3)).astype(np.float32),
        "model/1": rng.standard_normal(10).astype(np.float32),
        "model/2": rng.standard_normal(10).astype(np.float32),  # a header already made: two parts
        "state/0": np.array(7, dtype=np.int64),  # 0-d
        "state/1": np.zeros((0, 3), dtype=np.float64),  # empty
        "state/2": np.arange(12, dtype=np.float64).reshape(3, 4).T,  # Fortran order
        "state/3": np.arange(20, dtype=np.int32)[::3],  # strided
        "state/4": rng.standard_normal(5).astype(np.float16),
        "state/5": np.array([True, False, True]),
        "state/6": np.array(["ab", "cde"]),
        "grüße/0": np.ones(2, dtype=np.complex64),  # a name zipfile must read as UTF-8
        "__meta__": np.frombuffer(b'{"groups": {}}', dtype=np.uint8),
    }


def written(values: dict[str, np.ndarray]) -> bytes:
    out = BytesIO()
    write_npz(out, values)
    return out.getvalue()


def test_members_and_bytes_are_np_savez_s():
    values = arrays()
    ours, theirs = BytesIO(written(values)), BytesIO()
    np.savez(theirs, **values)
    with zipfile.ZipFile(ours) as mine, zipfile.ZipFile(theirs) as numpy_s:
        assert mine.testzip() is None  # every member's CRC-32 is right
        assert mine.namelist() == numpy_s.namelist() == [f"{name}.npy" for name in values]
        for info in mine.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            assert mine.read(info.filename) == numpy_s.read(info.filename)
    ours.seek(0)
    with np.load(ours, allow_pickle=False) as npz:
        assert npz.files == list(values)
        for name, array in values.items():
            loaded = npz[name]
            assert loaded.dtype == array.dtype and loaded.shape == array.shape
            np.testing.assert_array_equal(loaded, array)


def test_equal_arrays_give_equal_files():
    assert written(arrays()) == written(arrays())


def test_a_damaged_member_is_refused_when_read():
    values = {"a": np.arange(1000, dtype=np.float32)}
    data = bytearray(written(values))
    data[-200] ^= 0xFF  # inside the member's data, before the central directory
    with np.load(BytesIO(bytes(data)), allow_pickle=False) as npz, pytest.raises(zipfile.BadZipFile, match="CRC"):
        npz["a"]


def test_past_the_zip_limits_numpy_writes_the_archive(monkeypatch):
    monkeypatch.setattr(npz_writer, "_LIMIT", 100)  # as if the archive needed zip64
    values = {"a": np.arange(100, dtype=np.float32), "b": np.ones(3)}
    data = written(values)
    assert data[:5] == b"PK\x03\x04\x2d"  # np.savez's local header: version 4.5, zip64 extra fields
    with np.load(BytesIO(data), allow_pickle=False) as npz:
        np.testing.assert_array_equal(npz["a"], values["a"])
        np.testing.assert_array_equal(npz["b"], values["b"])


def test_object_arrays_are_refused_as_by_np_save():
    with pytest.raises(ValueError, match="pickle"):
        written({"a": np.array([{"x": 1}], dtype=object)})


def test_npy_parts_are_np_save_s_bytes_and_view_the_array():
    array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    saved = BytesIO()
    np.save(saved, array, allow_pickle=False)
    npy_bytes(np.zeros_like(array))  # the header of this dtype and shape is now kept
    parts = npy_parts(array)
    assert len(parts) == 2 and b"".join(parts) == saved.getvalue()
    assert isinstance(parts[1], memoryview) and np.shares_memory(np.frombuffer(parts[1], np.uint8), array)


def test_past_the_member_limit_numpy_writes_the_archive(monkeypatch):
    monkeypatch.setattr(npz_writer, "_MAX_MEMBERS", 1)
    data = written({"a": np.ones(2), "b": np.zeros(3)})
    assert data[:5] == b"PK\x03\x04\x2d"
    with np.load(BytesIO(data), allow_pickle=False) as npz:
        assert npz.files == ["a", "b"]


def test_write_atomic_makes_a_missing_folder_and_no_folder_call_when_it_is_there(tmp_path, monkeypatch):
    from pathlib import Path

    from lips_flwr.persistence.npz_store import write_atomic

    target = tmp_path / "a" / "b" / "state.npz"
    write_atomic(target, lambda f: f.write(b"one"))
    assert target.read_bytes() == b"one"
    made = []
    real_mkdir = Path.mkdir
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: made.append(self) or real_mkdir(self, *a, **k))
    write_atomic(target, lambda f: f.write(b"two"))
    assert target.read_bytes() == b"two" and made == []  # (a save of each round costs no mkdir)
    (tmp_path / "c").write_text("a file, not a folder")
    with pytest.raises(NotADirectoryError):
        write_atomic(tmp_path / "c" / "state.npz", lambda f: f.write(b"x"))
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.npz"]  # no temporary left
