"""Train and evaluate many clients' copies of one model at once, their tensors stacked.

Each client's parameters and buffers are stacked along a new leading
(client) dimension and the first net serves as the functional template:
``torch.func.vmap`` over ``torch.func.functional_call(template, (params,
buffers), x)`` runs every client's forward pass in one call, and ordinary
autograd on the stacked leaves gives every client its own gradient (the sum of
the clients' losses has, in client ``i``'s slice, exactly the gradient of
client ``i``'s loss). One ``torch.optim.SGD`` over the stacked tensors is
elementwise, so it is every client's own fresh optimizer at once.

:func:`train_stacked` does for each client what
:func:`~lips_flwr.experiments.task.training.train_tensors` does (same batches, same
augmentations: each client's generator is drawn from in the same order) and
:func:`evaluate_stacked` what :func:`~lips_flwr.experiments.task.training.evaluate_tensors`
does, up to floating-point rounding (vmap batches the convolutions and the
linear layer, which sums the weight gradients in another order: in one
backward pass of FashionCNN's 4 clients every weight gradient but the last
convolution's came out 1e-7 to 5e-5 relative apart). In float64 the two
agree to ~1e-12; in float32 usually to ~1e-7, but training on few samples
is chaotic: a rounding-sized difference can flip a ReLU or a max-pool
choice and then move some weights by far more (the sequential loop does
the same when its weights are nudged by 1e-7).
Images with large regions of one value (Fashion-MNIST's background, 65% of
its pixels) make such flips whole regions at once: one step on the paper
app's client data gave 6e-5 apart, and 2e-7 with 1e-4 of noise on the
inputs (``tests/unit/experiments/batched/test_engines_agree.py``).
BatchNorm running statistics and ``num_batches_tracked`` are updated in
place in the stacked buffers, one count per step, as in the sequential loop
(BatchNorm with ``momentum=None`` is not supported under vmap).

The nets must train alike (:mod:`.signature`: the same classes and
settings, modes, ``requires_grad``, and alike forward hooks): the template's
hooks (e.g. :func:`~lips_flwr.experiments.task.training.add_dropout`'s, alike on
every net) are applied to every client's slice, as each net's own would be;
a parameter frozen in every net stays frozen. Dropout runs
under ``randomness="different"``: each client draws its own masks from the
same distribution as the sequential loop, but not the same draws. The global
RNG is seeded from ``seeds[0]`` for the call (and restored afterwards), so a
run is reproducible.

Stacking is meant for an accelerator: on a 2-core CPU the sequential loop was
1.5-4x faster (``benchmarks/bench_stacked.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

from ..task.training import augment
from .signature import alone_reason, difference, model_signature

Stacked = dict[str, Tensor]


def _layout(net: nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """``(name, shape, dtype)`` of every state_dict entry, in order."""
    return [(k, tuple(v.shape), v.dtype) for k, v in net.state_dict().items()]


def check_stackable(nets: Sequence[nn.Module], data: Sequence[tuple[Tensor, Tensor]],
                    models_checked: bool = False) -> None:
    """Raise ``ValueError`` unless ``nets`` and ``data`` can be trained stacked.

    Needed: at least one net, one ``(x, y)`` per net with as many labels as
    samples, the same architecture (class, state_dict names, shapes and
    dtypes) for every net, nets that train alike (the same model signature,
    :mod:`.signature`, in their current modes; no hooks the stacked
    computation cannot apply), and the same sample count and sample shape
    for every client (stacked clients take the same number of steps).
    ``models_checked``: the caller has compared the nets' signatures already
    (the Rendezvous groups its calls by them); they are not computed again.
    """
    if not nets:
        raise ValueError("no nets to stack")
    if len(nets) != len(data):
        raise ValueError(f"{len(nets)} nets but {len(data)} (x, y) pairs")
    first = _layout(nets[0])
    for i, net in enumerate(nets[1:], start=1):
        layout = _layout(net)
        if type(net) is not type(nets[0]) or layout != first:
            diff = next((f"{a} vs {b}" for a, b in zip(first, layout) if a != b),
                        f"{len(first)} vs {len(layout)} state_dict entries")
            raise ValueError(
                f"different architectures: net {i} ({type(net).__name__}) differs from net 0 "
                f"({type(nets[0]).__name__}): {diff}")
    signatures = [] if models_checked else [model_signature(net) for net in nets]
    for i, signature in enumerate(signatures):
        alone = alone_reason(signature)
        if alone is not None:
            raise ValueError(f"net {i} cannot be stacked: {alone}")
        unlike = difference(signature, signatures[0]) if i else None
        if unlike is not None:
            raise ValueError(f"nets that train differently: net {i} differs from net 0: {unlike}")
    for i, (x, y) in enumerate(data):
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"client {i} has {x.shape[0]} samples but {y.shape[0]} labels")
    counts = [int(x.shape[0]) for x, _ in data]
    if len(set(counts)) > 1:
        raise ValueError(f"unequal sample counts cannot be stacked (group clients by count): {counts}")
    for what, shapes in (("samples", [tuple(x.shape[1:]) for x, _ in data]),
                         ("labels", [tuple(y.shape[1:]) for _, y in data])):
        if len(set(shapes)) > 1:
            raise ValueError(f"clients' {what} differ in shape: {shapes}")


def can_stack(nets: Sequence[nn.Module], data: Sequence[tuple[Tensor, Tensor]]) -> bool:
    """Whether :func:`check_stackable` accepts ``nets`` and ``data``."""
    try:
        check_stackable(nets, data)
    except ValueError:
        return False
    return True


def _stack(nets: Sequence[nn.Module]) -> tuple[Stacked, Stacked]:
    """Copies of the nets' parameters (leaves, for autograd) and buffers, stacked on dim 0."""
    params = {name: torch.stack([net.get_parameter(name).detach() for net in nets])
              .requires_grad_(p.requires_grad) for name, p in nets[0].named_parameters()}
    buffers = {name: torch.stack([net.get_buffer(name) for net in nets])
               for name, _ in nets[0].named_buffers()}
    return params, buffers


@torch.no_grad()
def _unstack(nets: Sequence[nn.Module], params: Stacked, buffers: Stacked) -> None:
    """Copy client ``i``'s slice of every stacked tensor back into ``nets[i]``."""
    for i, net in enumerate(nets):
        for name, value in params.items():
            net.get_parameter(name).copy_(value[i])
        for name, value in buffers.items():
            net.get_buffer(name).copy_(value[i])


def _sgd(template: nn.Module, params: Stacked, lr: float, momentum: float,
         weight_decay: float, decay_only: set[str] | None) -> torch.optim.SGD:
    """The optimizer of ``train_tensors``, same groups, over the stacked tensors.

    SGD is elementwise (``d_p = grad + wd * p``, momentum buffer, ``p -= lr * buf``),
    so one step over a stacked tensor is one step of every client's own optimizer.
    """
    names = [n for n, _ in template.named_parameters()]
    decayed = [params[n] for n in names if decay_only is None or n in decay_only]
    others = [params[n] for n in names if decay_only is not None and n not in decay_only]
    groups = [{"params": decayed, "weight_decay": weight_decay}]
    if others:
        groups.append({"params": others, "weight_decay": 0.0})
    return torch.optim.SGD(groups, lr=lr, momentum=momentum)


def _client_losses(template: nn.Module, params: Stacked, buffers: Stacked,
                   x: Tensor, y: Tensor) -> Tensor:
    """Every client's mean cross-entropy on its batch, shape ``(clients,)``."""
    def loss(p: Stacked, b: Stacked, xb: Tensor, yb: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(template, (p, b), (xb,)), yb)
    # "different": hooks such as dropout draw independent masks per client
    return vmap(loss, randomness="different")(params, buffers, x, y)


def _batch(data: Sequence[tuple[Tensor, Tensor]], orders: Sequence[Tensor],
           generators: Sequence[torch.Generator], start: int, batch_size: int,
           augmentation: str) -> tuple[Tensor, Tensor]:
    """Every client's batch as in ``train_tensors`` (its own generator), stacked."""
    xs, ys = [], []
    for (x, y), order, generator in zip(data, orders, generators):
        idx = order[start:start + batch_size]
        xs.append(augment(x[idx], augmentation, generator))
        ys.append(y[idx])
    return torch.stack(xs), torch.stack(ys)


@contextmanager
def _seeded_global_rng(seed: int, device: torch.device) -> Iterator[None]:
    """The global CPU (and ``device``'s CUDA) RNG seeded with ``seed``; restored on exit."""
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        for dev in cuda:
            with torch.cuda.device(dev):
                torch.cuda.manual_seed(seed)
        yield


def _autocast(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """``torch.autocast`` in ``dtype`` on ``device``; a no-op when ``dtype`` is ``None``."""
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def train_stacked(nets: Sequence[nn.Module], data: Sequence[tuple[Tensor, Tensor]], *,
                  seeds: Sequence[int], epochs: int, lr: float = 0.1, momentum: float = 0.9,
                  batch_size: int = 100, augmentation: str = "none", weight_decay: float = 0.0,
                  decay_only: set[str] | None = None, autocast: torch.dtype | None = None,
                  models_checked: bool = False) -> list[float]:
    """Train every net in place on its own (x, y), like ``train_tensors``; return the mean losses.

    Client ``i`` gets ``train_tensors(nets[i], *data[i], seed=seeds[i], ...)``
    with the other keyword arguments (and defaults) shared. The nets are
    written only at the end: if this raises (e.g. out of memory), their
    tensors are unchanged.

    Parameters, buffers and the returned losses match the sequential loop up
    to rounding, except under dropout (same distribution, different draws).
    Raises ``ValueError`` (see :func:`check_stackable`) for nets or data that
    cannot be stacked, or a seed count that differs from the net count.

    ``autocast`` (e.g. ``torch.bfloat16``): the forward passes and losses run
    under ``torch.autocast`` in that dtype; parameters, gradients and the
    optimizer stay in their own dtype. Not the sequential loop's numbers.
    ``models_checked``: see :func:`check_stackable`.
    """
    for net in nets:
        net.train()
    check_stackable(nets, data, models_checked)
    if len(seeds) != len(nets):
        raise ValueError(f"{len(nets)} nets but {len(seeds)} seeds")
    template = nets[0]
    params, buffers = _stack(nets)
    opt = _sgd(template, params, lr, momentum, weight_decay, decay_only)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    n, device = data[0][0].shape[0], data[0][0].device
    totals, count = [0.0] * len(nets), 0
    with _seeded_global_rng(seeds[0], device):
        for _ in range(epochs):
            # each generator draws its permutation first, then its batches' augmentations
            orders = [torch.randperm(n, generator=g).to(device) for g in generators]
            for start in range(0, n, batch_size):
                xb, yb = _batch(data, orders, generators, start, batch_size, augmentation)
                opt.zero_grad()
                with _autocast(device, autocast):
                    losses = _client_losses(template, params, buffers, xb, yb)
                losses.sum().backward()
                opt.step()
                for i, value in enumerate(losses.tolist()):  # one sync per step, not per client
                    totals[i] += value * yb.shape[1]
                count += yb.shape[1]
    _unstack(nets, params, buffers)
    return [total / max(count, 1) for total in totals]


@torch.no_grad()
def evaluate_stacked(nets: Sequence[nn.Module], data: Sequence[tuple[Tensor, Tensor]],
                     batch_size: int = 1000,
                     autocast: torch.dtype | None = None,
                     models_checked: bool = False) -> list[tuple[float, float]]:
    """(mean loss, accuracy) per net, like evaluate_tensors (``autocast``, ``models_checked``: as in
    :func:`train_stacked`)."""
    for net in nets:
        net.eval()
    check_stackable(nets, data, models_checked)
    template = nets[0]
    params, buffers = _stack(nets)
    x, y = torch.stack([x for x, _ in data]), torch.stack([y for _, y in data])

    def scores(p: Stacked, b: Stacked, xb: Tensor, yb: Tensor) -> tuple[Tensor, Tensor]:
        logits = functional_call(template, (p, b), (xb,))
        # under autocast the logits may be bfloat16: sum the losses in at least float32
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return (F.cross_entropy(wide, yb, reduction="sum"),
                (logits.argmax(dim=1) == yb).sum())

    batched = vmap(scores, randomness="different")
    n = x.shape[1]
    losses, correct = [0.0] * len(nets), [0] * len(nets)
    for start in range(0, n, batch_size):
        with _autocast(x.device, autocast):
            loss, hits = batched(params, buffers, x[:, start:start + batch_size],
                                 y[:, start:start + batch_size])
        for i, (value, h) in enumerate(zip(loss.tolist(), hits.tolist())):
            losses[i] += value
            correct[i] += int(h)
    return [(total / max(n, 1), hits_i / max(n, 1)) for total, hits_i in zip(losses, correct)]


__all__ = ["can_stack", "check_stackable", "evaluate_stacked", "train_stacked"]
