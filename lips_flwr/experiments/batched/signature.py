"""What must be alike for two clients' models to be trained stacked: a model's signature.

The stacked computation (:mod:`.stacked`) runs every client's forward pass
through the *first* client's modules (``functional_call`` on a template) and
trains stacked copies of the clients' tensors. So everything about a model
that changes its training, other than its tensors' values, must be the same
for every client of a stack, or the others would silently be trained as the
first is: the module classes and their settings (``momentum``, ``p``,
``stride``...), the modules' training mode, their forward (and forward-pre)
hooks, the parameters' names, shapes, dtypes, devices and ``requires_grad``,
the buffers' names, shapes, dtypes and devices.

Two hooks are alike when they are the same function, or functions of the same
code whose closures and defaults hold equal plain values (numbers, strings,
...) or the very same objects: ``add_dropout(net, names, p)`` registers alike
hooks on every client; a hook that closes over its own client's tensor does
not. Alike hooks are applied per client by the stacked computation, as the
sequential loop applies each client's own. Hooks it cannot apply at all (a
module's backward hooks, a parameter's tensor hooks) make the model's
signature its own: such a client is never stacked. State-dict hooks do not
change training and are not compared.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # the bookkeeping every module has (hooks, tensors)
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)
_FORWARD_HOOKS = ("_forward_pre_hooks", "_forward_hooks")  # applied by the stacked computation
_BACKWARD_HOOKS = ("_backward_pre_hooks", "_backward_hooks")  # not applied by it
_HOOK_KINDS = {hooks: hooks.strip("_").replace("_", " ") for hooks in _FORWARD_HOOKS}  # as entries name them

Entry = tuple[str, str, Any]  # (what: "module 'conv1'", which: "class", value)


@dataclass(frozen=True)
class Hook:
    """A registered hook, compared by what it does (see the module docstring), shown by its name."""

    name: str = field(compare=False)
    identity: tuple

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Alone:
    """A signature value no other model shares: the model must be trained on its own."""

    reason: str = field(compare=False)
    owner: int  # id() of the model

    def __repr__(self) -> str:
        return self.reason


def model_signature(net: nn.Module) -> list[Entry]:
    """Everything about ``net`` that changes its training, but its tensors' values, as entries.

    Modes are taken as they are: set them first (``net.train()``) as the
    loop will. Two models may be stacked when their signatures are equal.
    """
    entries: list[Entry] = []
    modules = list(net.named_modules())  # (one walk of the tree: the parameters and buffers follow it)
    for name, module in modules:
        what = f"module {name!r}"
        entries.append((what, "class", type(module)))
        entries.append((what, "training mode", module.training))
        entries += [(what, key, _plain(value)) for key, value in sorted(
            item for item in vars(module).items() if item[0] not in _MODULE_INTERNALS)]  # momentum, p...
        for hooks in _FORWARD_HOOKS:
            entries.append((what, _HOOK_KINDS[hooks], _hooks(module, hooks)))
        backward = any(getattr(module, hooks) for hooks in _BACKWARD_HOOKS)
        entries.append((what, "backward hooks", Alone(f"backward hooks on module {name!r}", id(net))
                        if backward else ()))
    for name, param in _members(modules, "_parameters"):
        what = f"parameter {name!r}"
        entries += [(what, "shape", tuple(param.shape)), (what, "dtype", param.dtype),
                    (what, "device", param.device), (what, "requires_grad", param.requires_grad)]
        tensor_hooks = param._backward_hooks or getattr(param, "_post_accumulate_grad_hooks", None)
        entries.append((what, "tensor hooks", Alone(f"tensor hooks on parameter {name!r}", id(net))
                        if tensor_hooks else ()))
    for name, buffer in _members(modules, "_buffers"):
        what = f"buffer {name!r}"
        entries += [(what, "shape", tuple(buffer.shape)), (what, "dtype", buffer.dtype),
                    (what, "device", buffer.device)]
    return entries


def _members(modules: list[tuple[str, nn.Module]], kind: str) -> list[tuple[str, torch.Tensor]]:
    """``net.named_parameters()`` (``kind="_parameters"``) or ``net.named_buffers()`` (``"_buffers"``)
    from ``net.named_modules()``, as torch makes them: each module's own in order, none that is
    ``None``, a tensor that two modules share named once, where it is met first."""
    seen: set[int] = set()
    members = []
    for prefix, module in modules:
        for key, tensor in getattr(module, kind).items():
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            members.append((f"{prefix}.{key}" if prefix else key, tensor))
    return members


def alone_reason(signature: list[Entry]) -> str | None:
    """Why a model with this signature cannot be stacked with any other (``None``: it can be)."""
    alone = next((value for _, _, value in signature if isinstance(value, Alone)), None)
    return None if alone is None else f"{alone.reason}, which the stacked computation cannot apply"


def difference(a: list[Entry], b: list[Entry]) -> str | None:
    """The first way signature ``a`` differs from ``b``, in words (``None`` when they are equal)."""
    for (what_a, which_a, value_a), (what_b, which_b, value_b) in zip(a, b):
        if (what_a, which_a) != (what_b, which_b):
            return f"{what_a} {which_a} vs {what_b} {which_b}"
        if value_a != value_b:
            alone = value_a if isinstance(value_a, Alone) else value_b
            if isinstance(alone, Alone):
                return f"{alone.reason}, which the stacked computation cannot apply"
            return f"{what_a} {which_a}: {_shown(value_a)} vs {_shown(value_b)}"
    if len(a) != len(b):
        extra = (a if len(a) > len(b) else b)[min(len(a), len(b))]
        return f"{extra[0]} {extra[1]} only in one model"
    return None


def _hooks(module: nn.Module, attribute: str) -> tuple[Hook, ...]:
    """The module's hooks of one kind, in order, with how each is called (kwargs, always)."""
    registered = getattr(module, attribute)
    if not registered:  # (most modules have none)
        return ()
    with_kwargs = getattr(module, attribute + "_with_kwargs", {})
    always = getattr(module, "_forward_hooks_always_called", {}) if attribute == "_forward_hooks" else {}
    return tuple(Hook(_name(hook), (_identity(hook), key in with_kwargs, key in always))
                 for key, hook in registered.items())


def _name(hook: Any) -> str:
    """A hook's name, with the values its closure holds: ``scaling.<locals>.<lambda>(factor=0.5)``."""
    name = getattr(hook, "__qualname__", type(hook).__name__)
    code, closure = getattr(hook, "__code__", None), getattr(hook, "__closure__", None)
    if code is None or not closure:
        return name
    values = []
    for var, cell in zip(code.co_freevars, closure):
        try:
            values.append(f"{var}={_plain(cell.cell_contents)!r}")
        except ValueError:  # an empty cell
            values.append(f"{var}=<empty>")
    return f"{name}({', '.join(values)})"


def _identity(hook: Any) -> tuple:
    """What makes two hooks alike: their code and the plain values (or very objects) they close over."""
    if isinstance(hook, functools.partial):
        return ("partial", _identity(hook.func), _plain(hook.args), _plain(sorted(hook.keywords.items())))
    if hasattr(hook, "__func__") and hasattr(hook, "__self__"):  # a bound method: its object's own
        return ("method", _identity(hook.__func__), id(hook.__self__))
    code = getattr(hook, "__code__", None)
    if code is None:
        return ("object", id(hook))
    cells = []
    for cell in hook.__closure__ or ():
        try:
            cells.append(_plain(cell.cell_contents))
        except ValueError:  # an empty cell
            cells.append(("empty",))
    return ("function", code, id(getattr(hook, "__globals__", None)), tuple(cells),
            _plain(getattr(hook, "__defaults__", None)), _plain(getattr(hook, "__kwdefaults__", None)))


@dataclass(frozen=True)
class _Object:
    """A value that is not plain: equal only to itself (the very same object)."""

    owner: int  # its id()
    name: str = field(compare=False)

    def __repr__(self) -> str:
        return f"<{self.name}>"


def _plain(value: Any) -> Any:
    """``value`` if it is a plain value (or a tuple, list or dict of them), else the object itself, by id."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple((_plain(k), _plain(v)) for k, v in value.items())
    return _Object(id(value), getattr(value, "__qualname__", type(value).__name__))


def _shown(value: Any) -> str:
    """A value of a signature entry, as a warning shows it."""
    return value.__name__ if isinstance(value, type) else repr(value)


__all__ = ["Alone", "Hook", "alone_reason", "difference", "model_signature"]
