"""ClientApp: the paper's local training on each client's low-data split.

FedBN (``fedbn_mod``) is on for every algorithm but ``fedavg``; ``lips_mod``
reports local update norms (and masks in client mode). Each client evaluates
its trained model on its own test set (``acc-before``, before aggregation)
and the model it receives (``acc-after``).

The same seed gives the same numbers in every run: the data split, the
batch order and augmentation (a generator per client and round), dropout
(torch's global generator, seeded per client and round) and one CPU thread
per client; on a GPU, deterministic kernels (``torch.use_deterministic_algorithms``).

A call borrows a model of the run's architecture and loads the global state
into it (every parameter and buffer), instead of building one: building and
initialising it was ~15% of a small model's call outside its training. The
numbers do not change: the load overwrites the whole state, training seeds
torch's generator itself, and a dropout control's hooks are removed before
the model goes back.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Iterator
from typing import NamedTuple, NoReturn

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from lips_flwr._records import numpy_to_record, record_views
from lips_flwr.clients import fedbn_mod, lips_mod, persistent_state_mod
from lips_flwr.experiments.task.data import DATASET_INFO, client_split, load_dataset
from lips_flwr.core.layers import select_layers
from lips_flwr.experiments.task.models import build_model
from lips_flwr.experiments.task.training import SEQUENTIAL, add_dropout, local_compute
from lips_paper.algorithms import algorithm

torch.set_num_threads(1)  # many simulated clients share the CPU cores (and one thread sums alike)
# Deterministic GPU kernels; cuBLAS needs this before CUDA starts in this process.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True
torch.use_deterministic_algorithms(True, warn_only=True)


def fedbn_unless_fedavg(msg: Message, context: Context, call_next) -> Message:
    """FedBN for every algorithm of the paper but plain FedAvg."""
    if algorithm(str(context.run_config["algorithm"])).local_bn:
        return fedbn_mod(msg, context, call_next)
    return call_next(msg, context)


app = ClientApp(mods=[persistent_state_mod, fedbn_unless_fedavg, lips_mod])


def device_of(cfg) -> torch.device:
    """The run config's ``device``; ``auto``: ``cuda`` where available, else ``cpu``."""
    return _device(str(cfg["device"]))


@functools.cache
def _device(wanted: str) -> torch.device:
    """(Once per name: ``torch.cuda.is_available()`` asks the driver, ~10 us of every call.)"""
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(wanted)


@functools.lru_cache(maxsize=None)
def client_tensors(dataset: str, path: str, pid: int, samples: int, test_samples: int,
                   alpha: float, seed: int, device: str, val_fraction: float):
    """This client's normalised (train, val, test) tensor pairs, built once per worker process.

    The validation split is carved from the client's own training samples
    (hyperparameters are selected on it, never on the test sets).
    """
    data = load_dataset(dataset, path or None, seed)
    x, y, xt, yt = client_split(data, pid, samples, test_samples, alpha, seed)
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)
    prep = lambda a: ((torch.from_numpy(a).float() / 255 - mean) / std).to(device)  # noqa: E731
    label = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    n_val = int(round(val_fraction * len(y)))
    train = (prep(x[n_val:]), label(y[n_val:]))
    val = (prep(x[:n_val]), label(y[:n_val]))
    return train, val, (prep(xt), label(yt))


class Lent(NamedTuple):
    """A model lent for one call, with its tensors by name (``state_dict(keep_vars=True)``), its
    parameters and the numpy views of its CPU tensors (:func:`cpu_views`), found once when the model
    was built: the paper app changes a model's tensors only in place (training, batch norm's
    statistics, :func:`load_received`, the stacked engine's ``copy_``), never gives it others, so
    they stay the model's (torch's ``state_dict`` walks every module again, a tenth of a
    millisecond a call)."""

    net: torch.nn.Module
    state: dict[str, torch.Tensor]
    params: list[torch.nn.Parameter]
    views: dict[str, np.ndarray]


# Spare models per (architecture, device): never more than were borrowed at once (one in a Ray
# worker or on the sequential engine, a round's clients on the stacked engine, whose models
# exist together during its calls anyway).
_spare: dict[tuple, list[Lent]] = {}
_spare_lock = threading.Lock()


@contextlib.contextmanager
def borrowed_model(model: str, num_classes: int, channels: int, device: torch.device) -> Iterator[Lent]:
    """A model of this architecture on ``device`` for one call, whose whole state the caller overwrites.

    A spare one when there is, else a new one; it goes back to the spares,
    without its gradients, when the block ends without an error (an error
    leaves it out).
    """
    key = (model, num_classes, channels, str(device))
    with _spare_lock:
        spares = _spare.setdefault(key, [])
        lent = spares.pop() if spares else None
    if lent is None:
        net = build_model(model, num_classes, channels).to(device)
        state = net.state_dict(keep_vars=True)
        lent = Lent(net, state, list(net.parameters()), cpu_views(net, state))
    yield lent
    for param in lent.params:  # (what net.zero_grad(set_to_none=True) does: memory a spare does not need)
        param.grad = None
    with _spare_lock:
        spares.append(lent)


@contextlib.contextmanager
def setup(msg: Message, context: Context):
    """``(run config, partition id, lent model with the received state, this client's data)`` for one call."""
    cfg = context.run_config
    device = device_of(cfg)
    pid = int(context.node_config["partition-id"])
    tensors = client_tensors(str(cfg["dataset"]), str(cfg["dataset-path"]), pid,
                             int(cfg["samples-per-client"]), int(cfg["test-samples"]),
                             float(cfg["alpha"]), int(cfg["seed"]), str(device),
                             float(cfg["val-fraction"]))
    num_classes, channels = DATASET_INFO[str(cfg["dataset"])]
    with borrowed_model(str(cfg["model"]), num_classes, channels, device) as lent:
        load_received(lent.net, msg.content["arrays"], lent.state, lent.views)
        yield cfg, pid, lent, tensors


def load_received(net: torch.nn.Module, record: ArrayRecord, targets: dict[str, torch.Tensor] | None = None,
                  views: dict[str, np.ndarray] | None = None) -> None:
    """Every parameter and buffer of ``net`` set to the received array of its name.

    ``targets`` and ``views``: ``net``'s ``state_dict(keep_vars=True)`` and
    :func:`cpu_views` where the caller knows them (a :class:`Lent` model's);
    else they are found now.

    What ``net.load_state_dict(state)`` does for the paper's models (plain
    convolution, linear and batch-norm layers: no load hooks, no loading of
    their own): a copy of each array into the tensor, cast to the tensor's
    dtype as ``Tensor.copy_`` casts, without its per-module checks and hooks.
    On the CPU through a numpy view of each tensor made once
    (:func:`cpu_views`): a ``copy_`` per tensor costs a torch call that lets
    go of the GIL, 0.2-0.5 ms a call where other threads run Python (the
    batched Grid's writer of client state files). Stricter where
    ``load_state_dict`` is lenient (it takes a 1-element array for a 0-d
    tensor, and leaves a BatchNorm's ``num_batches_tracked`` as it was when
    the array is missing): a missing or unexpected name, or another shape, is
    a ``ValueError`` naming them, so that a borrowed model keeps no value of
    the client before. (``ArrayRecord.to_torch_state_dict()`` would parse
    every ``.npy`` header as a Python literal.)
    """
    arrays = record_views(record)
    if targets is None:
        targets = net.state_dict(keep_vars=True)
    if views is None:
        views = cpu_views(net, targets)
    # (A view's shape is a tuple, compared faster than a torch.Size: the check runs every call.)
    if arrays.keys() != targets.keys() or any(
            array.shape != (views[name].shape if name in views else targets[name].shape)
            for name, array in arrays.items()):
        raise_misfit(arrays, targets)
    elsewhere = []  # (tensor, array) for the tensors without a view: on a GPU, or of a dtype numpy lacks
    with torch.no_grad():
        for name, array in arrays.items():
            view = views.get(name)
            if view is not None:  # (assignment casts as copy_ does, float64 to float32 and so on:
                view[...] = array  # numpy's "unsafe" casting, as np.copyto's casting="unsafe", faster)
            else:
                elsewhere.append((targets[name], array))
        if elsewhere:
            copy_in(elsewhere)


def copy_in(pairs: list[tuple[torch.Tensor, np.ndarray]]) -> None:
    """Copy each array into its tensor, cast as ``Tensor.copy_`` casts (under ``torch.no_grad()``).

    The arrays of one dtype bound for one device are joined on the host and
    moved in one transfer, then copied into their tensors there: a GPU
    model's ~56 tensors cost one host-to-device copy per dtype, not one each,
    every one of which waits for the device.
    """
    groups: dict[tuple[np.dtype, torch.device], list[tuple[torch.Tensor, np.ndarray]]] = {}
    for tensor, array in pairs:
        groups.setdefault((array.dtype, tensor.device), []).append((tensor, array))
    for (_, device), group in groups.items():
        # (a new, writable array, as torch wants: the record's are read-only views of its bytes)
        joined = torch.from_numpy(np.concatenate([array.reshape(-1) for _, array in group])).to(device)
        for (tensor, array), part in zip(group, joined.split([array.size for _, array in group])):
            tensor.copy_(part.view(array.shape))


def host_arrays(state: dict[str, torch.Tensor], views: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``{name: tensor.numpy(force=True)}`` of ``state``, in its order: the CPU tensors' ``views``
    (:func:`cpu_views`); the others brought to the host joined, one transfer per dtype and device
    rather than one per tensor (a dtype numpy lacks is its ``TypeError``, as ``numpy()``'s)."""
    arrays: dict[str, np.ndarray] = {}
    groups: dict[tuple[torch.dtype, torch.device], list[str]] = {}
    for name, tensor in state.items():
        if name in views:
            arrays[name] = views[name]
        else:
            groups.setdefault((tensor.dtype, tensor.device), []).append(name)
    for names in groups.values():
        tensors = [state[name].detach() for name in names]
        joined = torch.cat([tensor.reshape(-1) for tensor in tensors]).numpy(force=True)
        start = 0
        for name, tensor in zip(names, tensors):
            arrays[name] = joined[start:start + tensor.numel()].reshape(tuple(tensor.shape))
            start += tensor.numel()
    return {name: arrays[name] for name in state}


def raise_misfit(arrays: dict[str, np.ndarray], targets: dict[str, torch.Tensor]) -> NoReturn:
    """The ``ValueError`` of :func:`load_received` for arrays that do not fit the model's tensors."""
    missing, unexpected = sorted(targets.keys() - arrays.keys()), sorted(arrays.keys() - targets.keys())
    misshapen = [f"{name} {tuple(array.shape)} for {tuple(targets[name].shape)}"
                 for name, array in arrays.items() if name in targets and array.shape != targets[name].shape]
    raise ValueError(f"the received model does not fit this one: missing {missing}, unexpected "
                     f"{unexpected}, other shapes [{', '.join(misshapen)}]")


# Per model and name: (its tensor, where and how it lies, a writable numpy view of it or None).
_cpu_views: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, tuple]] = weakref.WeakKeyDictionary()
_cpu_views_lock = threading.Lock()


def cpu_views(net: torch.nn.Module, targets: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Writable numpy views of ``net``'s CPU tensors (``targets``: its ``state_dict(keep_vars=True)``).

    Made once per tensor and kept while ``net`` lives; made again for a
    tensor that is another object, or lies elsewhere or otherwise (data
    pointer, shape, strides, dtype: ``param.data = ...``), than when it was
    made. Training changes the tensors in place (the optimizer's step, batch
    norm's statistics, the stacked engine's ``copy_``), so a view stays the
    tensor's. A tensor numpy cannot view (bfloat16) has none.
    """
    with _cpu_views_lock:
        known = _cpu_views.setdefault(net, {})
    views = {}
    for name, tensor in targets.items():
        if not tensor.is_cpu:
            continue
        layout = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype)
        entry = known.get(name)
        if entry is None or entry[0] is not tensor or entry[1] != layout:
            try:
                view = tensor.detach().numpy()
            except TypeError:  # (a dtype numpy lacks: loaded by copy_)
                view = None
            entry = known[name] = (tensor, layout, view)
        if entry[2] is not None:
            views[name] = entry[2]
    return views


def seed_torch(seed: int, device: torch.device) -> None:
    """``torch.manual_seed(seed)`` for a client on ``device``: the CPU's generator, and CUDA's once started.

    ``torch.manual_seed`` also queues a seed for every device backend not yet
    started (CUDA on a CPU run, XPU, MTIA), formatting a stack trace for each:
    a tenth of a millisecond per call that changes no draw here (the data
    live on the client's device, so CUDA is started before this runs). On
    another device type it is ``torch.manual_seed`` itself.
    """
    if device.type not in ("cpu", "cuda"):
        torch.manual_seed(seed)
        return
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


@functools.cache
def middle_layers(model: str, num_classes: int, channels: int) -> tuple[str, ...]:
    """The layers LIPS masks in this model, in its order (names only: the same for every client and round)."""
    net = build_model(model, num_classes, channels)
    return tuple(select_layers({k: v.numpy() for k, v in net.state_dict().items()}, "middle"))


def release(device_type: str) -> None:
    # Idle Ray workers would otherwise keep the memory; in one process that runs every
    # client (the batched Grid's stacked engine), emptying the cache per client only slows it.
    if device_type == "cuda" and local_compute() is SEQUENTIAL:
        torch.cuda.empty_cache()


def accuracies(net, val, test, when: str) -> dict:
    """Test (and validation, when carved) accuracy of ``net``, keyed ``acc-<when>``."""
    compute = local_compute()
    loss, acc = compute.evaluate(net, *test)
    out = {f"acc-{when}": acc, f"loss-{when}": loss}
    if val[1].numel():
        out[f"val-acc-{when}"] = compute.evaluate(net, *val)[1]
    return out


@app.train()
def train(msg: Message, context: Context) -> Message:
    with setup(msg, context) as (cfg, pid, lent, (train_set, val, test)):
        net = lent.net
        algo = algorithm(str(cfg["algorithm"]))
        rnd = int(msg.content["config"]["server-round"])
        middle = list(middle_layers(str(cfg["model"]), *DATASET_INFO[str(cfg["dataset"])]))
        seed = (int(cfg["seed"]) * 1_000_003 + rnd) * 1009 + pid
        # A control: dropout on the layers LIPS would mask (hooks removed before the model goes back).
        hooks = add_dropout(net, middle, float(cfg["dropout"])) if algo.dropout else []
        try:
            # Dropout draws from torch's global generator, whose state would otherwise be whatever
            # this worker process ran before (another client, another round).
            seed_torch(seed, train_set[0].device)
            loss = local_compute().train(  # train_tensors, or with other clients at once (batched Grid)
                net, *train_set, epochs=int(cfg["local-epochs"]), lr=float(cfg["lr"]),
                momentum=float(cfg["momentum"]), batch_size=int(cfg["batch-size"]),
                augmentation=str(cfg["augment"]), seed=seed,
                weight_decay=float(cfg["weight-decay"]) if algo.weight_decay else 0.0,
                decay_only=set(middle) if algo.weight_decay else None,
            )
        finally:
            for hook in hooks:
                hook.remove()
        # partition-id: the ServerApp orders the replies by it (server_app.stable_order).
        metrics = {"train-loss": loss, "num-examples": int(train_set[1].shape[0]), "partition-id": pid}
        if msg.content["config"].get("eval-before", True):  # the ServerApp asks only where it records it
            metrics.update(accuracies(net, val, test, "before"))
        # Serialized (copied) here, before the model goes back for another call; as ViewedArrays,
        # which the mods and, on the batched Grid, the server read without parsing them again.
        arrays = numpy_to_record(host_arrays(lent.state, lent.views), viewed=True)
    release(train_set[0].device.type)
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    with setup(msg, context) as (_, pid, lent, (_, val, test)):
        metrics = {**accuracies(lent.net, val, test, "after"), "num-examples": int(test[1].shape[0]),
                   "partition-id": pid}
    release(test[0].device.type)
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
