"""The digits loader, model, training loop and results writer the example apps use."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from lips_flwr.experiments.task.data import load_digits_client
from lips_flwr.core.layers import select_layers
from lips_flwr.experiments.task.models import DigitsCNN
from lips_flwr.experiments.results import write_json_atomic
from lips_flwr.experiments.task.training import evaluate, train


def labels(dataset) -> np.ndarray:
    return dataset.tensors[1].numpy()


def test_each_client_gets_exact_sizes_and_matching_proportions():
    for pid in range(5):
        train_set, test_set = load_digits_client(pid, samples=100, alpha=0.1, seed=3, test_size=400)
        assert len(train_set) == 100 and len(test_set) == 400
        assert train_set.tensors[0].shape[1:] == (1, 8, 8)
        p_train = np.bincount(labels(train_set), minlength=10) / 100
        p_test = np.bincount(labels(test_set), minlength=10) / 400
        # Both are multinomial draws from the same Dir(alpha) proportions.
        assert np.abs(p_train - p_test).max() < 0.2
        assert set(np.flatnonzero(p_test > 0.1)) <= set(np.flatnonzero(p_train > 0))


def test_the_digits_are_scikit_learns_without_importing_it():
    """Read from scikit-learn's data file, the arrays load_digits gives, bit for bit; sklearn not imported."""
    code = ("import sys\n"
            "from lips_flwr.experiments.task.data.datasets import digits_arrays\n"
            "digits_arrays()\n"
            "print('sklearn' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from sklearn.datasets import load_digits

    from lips_flwr.experiments.task.data.datasets import digits_arrays

    images, target = digits_arrays()
    digits = load_digits()
    assert images.dtype == digits.images.dtype and target.dtype == digits.target.dtype
    assert np.array_equal(images, digits.images) and np.array_equal(target, digits.target)


def test_split_is_seeded_and_reproducible():
    a, _ = load_digits_client(2, seed=7)
    b, _ = load_digits_client(2, seed=7)
    c, _ = load_digits_client(2, seed=8)
    assert torch.equal(a.tensors[0], b.tensors[0])
    assert not torch.equal(a.tensors[0], c.tensors[0])


def test_model_has_two_middle_layers_and_learns():
    net = DigitsCNN()
    state = {k: v.numpy() for k, v in net.state_dict().items()}
    assert select_layers(state) == ["conv2.weight", "conv3.weight"]
    train_set, _ = load_digits_client(0, samples=100, alpha=100.0, seed=0)
    before, _ = evaluate(net, train_set)
    train(net, train_set, epochs=30, seed=0)
    after, accuracy = evaluate(net, train_set)
    assert after < before and accuracy > 0.5


def test_results_are_written_atomically(tmp_path):
    path = tmp_path / "sub" / "results.json"
    write_json_atomic(path, {"x": np.float32(1.5), "n": np.int64(3)})
    assert json.loads(path.read_text()) == {"n": 3, "x": 1.5}
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object.__new__(type("NoItem", (), {"item": 1}))})
    assert json.loads(path.read_text()) == {"n": 3, "x": 1.5}  # old file intact
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temp left


def test_a_results_write_removes_what_a_killed_writer_left(tmp_path):
    """A process killed in mid-write leaves ``.<name>.<pid>.<random>``; the next write removes it."""
    import os
    import subprocess
    import sys

    path = tmp_path / "results.json"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    left = tmp_path / f".results.json.{dead}.k3j9x_"
    live = tmp_path / f".results.json.{os.getppid()}.a8b2c_"  # a running writer's: it stays
    own = tmp_path / ".results.json.partial"  # not a temporary: a file of that name (prereg.py's form)
    left.write_text("{"), live.write_text("{"), own.write_text("{")
    write_json_atomic(path, {"x": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, own.name, "results.json"])


def test_weight_decay_only_on_named_parameters():
    from lips_flwr.experiments.task.training import train_tensors

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    with torch.no_grad():
        net[0].bias.zero_()  # zero inputs and bias: no gradient reaches either weight
    x, y = torch.zeros(8, 4), torch.zeros(8, dtype=torch.long)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    train_tensors(net, x, y, epochs=1, lr=0.1, momentum=0.0, weight_decay=0.5, batch_size=8,
                  decay_only={"0.weight"})
    after = dict(net.named_parameters())
    torch.testing.assert_close(after["0.weight"], before["0.weight"] * (1 - 0.1 * 0.5))
    torch.testing.assert_close(after["1.weight"], before["1.weight"])  # no gradient, no decay


def test_dropout_hooks_act_in_training_only():
    from lips_flwr.experiments.task.training import add_dropout

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(50, 50), torch.nn.Linear(50, 2))
    handles = add_dropout(net, ["0.weight"], 0.5)
    x = torch.ones(4, 50)
    net.train()
    hidden = net[0](x)
    assert (hidden == 0).float().mean() > 0.3
    net.eval()
    assert (net[0](x) == 0).sum() == 0
    for h in handles:
        h.remove()


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_results_files_get_a_normal_files_mode(tmp_path, umask):
    """mkstemp makes 0600 files; a results file is read like the plot beside it (0666 & ~umask)."""
    import os
    import stat

    old = os.umask(umask)
    try:
        path = tmp_path / "results.json"
        write_json_atomic(path, {"x": 1})
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
        write_json_atomic(path, {"x": 2})  # a replaced file too
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    finally:
        os.umask(old)
