"""The low-data Dirichlet split and the dataset loaders, on small offline data."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from lips_flwr.experiments.task.data import class_proportions, client_split, load_dataset, low_data_indices, read_idx
from lips_flwr.experiments.task.data import datasets as ds

LABELS = np.repeat(np.arange(10), 500)  # 5000 examples, 10 balanced classes
TEST_LABELS = np.repeat(np.arange(10), 100)


@pytest.mark.parametrize("alpha", [0.01, 0.1, 0.5, 100.0])
def test_exact_sizes_and_valid_indices(alpha):
    for pid in range(20):
        idx = low_data_indices(LABELS, pid, 100, alpha, seed=1)
        assert idx.shape == (100,) and idx.min() >= 0 and idx.max() < LABELS.size


def test_counts_follow_the_clients_dirichlet_proportions():
    """Over many draws, a client's class counts average to samples * q."""
    q = class_proportions(10, 3, 0.5, seed=2)
    counts = np.bincount(LABELS[low_data_indices(LABELS, 3, 20000, 0.5, seed=2)], minlength=10)
    np.testing.assert_allclose(counts / 20000, q, atol=0.02)


def test_train_and_test_share_proportions_but_draw_independently():
    for pid in range(10):
        q = class_proportions(10, pid, 0.1, seed=7)
        tr = LABELS[low_data_indices(LABELS, pid, 100, 0.1, 7, "train")]
        te = TEST_LABELS[low_data_indices(TEST_LABELS, pid, 400, 0.1, 7, "test", num_classes=10)]
        # classes with no chance (q ~ 0) appear in neither split
        for c in np.flatnonzero(q < 1e-6):
            assert c not in tr and c not in te
        assert np.abs(np.bincount(te, minlength=10) / 400 - q).max() < 0.12
        assert np.abs(np.bincount(tr, minlength=10) / 100 - q).max() < 0.2


def test_seeded_reproducible_and_independent_of_other_clients():
    a = low_data_indices(LABELS, 5, 100, 0.1, seed=3)
    np.testing.assert_array_equal(a, low_data_indices(LABELS, 5, 100, 0.1, seed=3))
    assert not np.array_equal(a, low_data_indices(LABELS, 5, 100, 0.1, seed=4))
    assert not np.array_equal(a, low_data_indices(LABELS, 6, 100, 0.1, seed=3))


def test_small_classes_are_drawn_with_replacement_and_clients_may_overlap():
    labels = np.array([0] * 3 + [1] * 1000)
    idx = np.concatenate([low_data_indices(labels, p, 100, 100.0, seed=0) for p in range(5)])
    assert (labels[idx] == 0).sum() > 3  # class 0 has 3 examples, drawn more often
    assert np.unique(idx).size < idx.size


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"alpha": 0.0}, "`alpha` must be > 0"), ({"samples": 0}, "`samples` must be an integer"),
     ({"split": "val"}, "`split` must be one of"), ({"partition_id": -1}, "`partition_id`")],
)
def test_bad_arguments(kwargs, match):
    args = {"labels": LABELS, "partition_id": 0, "samples": 10, "alpha": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        low_data_indices(**args)


def test_flwr_datasets_partitioner():
    datasets = pytest.importorskip("datasets")
    from lips_flwr.experiments.task.data.partitioner import LowDataDirichletPartitioner

    data = datasets.Dataset.from_dict({"x": np.arange(LABELS.size), "label": LABELS})
    train = LowDataDirichletPartitioner(8, samples=50, alpha=0.1, seed=1)
    train.dataset = data
    part = train.load_partition(3)
    assert len(part) == 50 and train.num_partitions == 8
    np.testing.assert_array_equal(part["x"], low_data_indices(LABELS, 3, 50, 0.1, 1))
    with pytest.raises(ValueError, match="partition_id"):
        train.load_partition(8)
    with pytest.raises(ValueError, match="`alpha` must be > 0"):
        LowDataDirichletPartitioner(8, alpha=0)


def write_idx(path, array):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 0x08, array.ndim))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def test_fashion_mnist_from_a_folder_of_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (50, 28, 28)), np.arange(50) % 10
    for prefix in ("train", "t10k"):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", labels)
    data = ds.load_fashion_mnist(tmp_path)
    assert data.x_train.shape == (50, 1, 28, 28) and data.num_classes == 10
    np.testing.assert_array_equal(data.x_train[:, 0], images)
    np.testing.assert_array_equal(read_idx(tmp_path / "t10k-labels-idx1-ubyte.gz"), labels)
    with pytest.raises(FileNotFoundError, match="no Fashion-MNIST IDX files"):
        ds.load_fashion_mnist(tmp_path / "missing")


def test_debian_fashion_mnist_when_installed():
    if not all(ds._find_idx(__import__("pathlib").Path(d), "train-images-idx3-ubyte")
               for d in ds.FASHION_MNIST_DIRS):
        pytest.skip("Debian's dataset-fashion-mnist is not installed")
    data = load_dataset("fashion-mnist")
    assert data.x_train.shape == (60000, 1, 28, 28) and data.x_test.shape == (10000, 1, 28, 28)
    x, y, xt, yt = client_split(data, 0, 100, 400, 0.1, 0)
    assert x.shape == (100, 1, 28, 28) and xt.shape == (400, 1, 28, 28)


def test_hf_loader_converts_images(monkeypatch):
    """The CIFAR path, fed by a tiny in-memory DatasetDict instead of the Hub."""
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    def fake(n, offset):
        imgs = [Image.fromarray(np.full((32, 32, 3), i + offset, dtype=np.uint8)) for i in range(n)]
        return datasets.Dataset.from_dict({"img": imgs, "label": list(range(n))})

    dd = datasets.DatasetDict({"train": fake(10, 0), "test": fake(4, 100)})
    monkeypatch.setattr(datasets, "load_dataset", lambda repo: dd)
    data = ds.load_hf_images("cifar10")
    assert data.x_train.shape == (10, 3, 32, 32) and data.x_test.shape == (4, 3, 32, 32)
    assert data.x_test[2, 0, 0, 0] == 102 and list(data.y_train) == list(range(10))


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="`dataset` must be one of"):
        load_dataset("mnist-but-not")


@pytest.mark.parametrize("alpha", [0.01, 0.1, 100.0])
def test_a_splits_pools_give_the_draws_found_without_them(alpha):
    """client_split draws from each split's class indices, found once (ImageDataset's pools): the same."""
    from lips_flwr.experiments.task.data.partition import class_indices

    labels = np.concatenate([np.repeat(np.arange(9), 40), [3, 3]])  # class 9 missing from this split
    rng = np.random.default_rng(0)
    labels = labels[rng.permutation(labels.size)]
    pools = class_indices(labels, 10)
    assert [p.tolist() for p in pools] == [np.flatnonzero(labels == c).tolist() for c in range(10)]
    assert not any(p.flags.writeable for p in pools)  # (shared by every client a process builds)
    for pid in range(30):
        for split, samples in (("train", 100), ("test", 7)):
            np.testing.assert_array_equal(low_data_indices(labels, pid, samples, alpha, 5, split, 10, pools),
                                          low_data_indices(labels, pid, samples, alpha, 5, split, 10))
    with pytest.raises(ValueError, match=r"labels must be in 0 \.\. 9, got 0 \.\. 10"):
        class_indices(np.array([0, 10]), 10)


def test_a_split_is_drawn_from_its_datasets_pools(tmp_path):
    rng = np.random.default_rng(1)
    images, labels = rng.integers(0, 256, (60, 28, 28)), rng.integers(0, 10, 60)
    for prefix in ("train", "t10k"):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", labels)
    data = ds.load_fashion_mnist(tmp_path)
    x, y, xt, yt = client_split(data, 4, 20, 5, 0.1, 3)
    tr = low_data_indices(data.y_train, 4, 20, 0.1, 3, "train", 10)
    te = low_data_indices(data.y_test, 4, 5, 0.1, 3, "test", 10)
    np.testing.assert_array_equal(x, data.x_train[tr])
    np.testing.assert_array_equal(y, data.y_train[tr])
    np.testing.assert_array_equal(xt, data.x_test[te])
    np.testing.assert_array_equal(yt, data.y_test[te])
    assert data.train_pools is data.train_pools  # found once


def test_read_idx_reads_a_gzip_file_of_several_members_and_refuses_a_cut_one(tmp_path):
    labels = np.arange(30) % 10
    whole = struct.pack(">HBB", 0, 0x08, 1) + struct.pack(">I", 30) + labels.astype(np.uint8).tobytes()
    (tmp_path / "two.gz").write_bytes(gzip.compress(whole[:9]) + gzip.compress(whole[9:]))
    np.testing.assert_array_equal(read_idx(tmp_path / "two.gz"), labels)
    (tmp_path / "cut.gz").write_bytes(gzip.compress(whole)[:-12])
    with pytest.raises(EOFError):
        read_idx(tmp_path / "cut.gz")
    (tmp_path / "plain.gz").write_bytes(whole)  # not gzip: gzip's own error, as before
    with pytest.raises(gzip.BadGzipFile):
        read_idx(tmp_path / "plain.gz")
    damaged = bytearray(gzip.compress(whole))
    damaged[-8] ^= 0xFF  # the CRC
    (tmp_path / "damaged.gz").write_bytes(bytes(damaged))
    with pytest.raises(gzip.BadGzipFile):
        read_idx(tmp_path / "damaged.gz")
