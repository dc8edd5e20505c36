"""LIPS for legacy ``NumPyClient`` apps: tracks local update deltas, wraps or is subclassed."""

from __future__ import annotations

import fnmatch
import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.client import NumPyClient
from flwr.common import NDArrays, Scalar

from ..core.layers import batch_norm_names
from ..protocol import config_round
from .persist import load_state, save_state, state_path
from .state import after_training, before_training, client_salt, restore_local, save_local

_OPTIONAL = ("get_properties", "get_parameters", "evaluate")


def _next_in_mro(cls: type, method: str) -> Callable | None:
    """The implementation of ``method`` after LIPSNumPyClient in ``cls``'s MRO."""
    mro = cls.__mro__
    for klass in mro[mro.index(LIPSNumPyClient) + 1:]:
        if method in vars(klass):
            return vars(klass)[method]
    return None


def _missing_methods(cls: type, client: NumPyClient | None) -> frozenset[str]:
    """The optional methods that neither the wrapped ``client`` nor (subclassed) the classes
    after LIPSNumPyClient in ``cls`` implement."""
    missing = set()
    for method in _OPTIONAL:
        impl = getattr(type(client), method) if client is not None else _next_in_mro(cls, method)
        if impl is None or impl is getattr(NumPyClient, method):
            missing.add(method)
    return frozenset(missing)


@functools.cache
def _variant(cls: type, missing: frozenset[str]) -> type:
    """``cls`` with NumPyClient's own ``missing`` methods: what Flower reads as "not implemented"."""
    return type(cls.__name__, (cls,), {"_lips_variant": True,
                                       **{m: getattr(NumPyClient, m) for m in missing}})


class LIPSNumPyClient(NumPyClient):
    """A ``NumPyClient`` with LIPS: delta tracking, client-mode masking, FedBN.

    Wrap a user's client (``client_fn`` changes by one line)::

        return LIPSNumPyClient(MyClient(net, data), context).to_client()

    or subclass it, LIPS first, so its ``fit`` runs around yours::

        class MyLIPSClient(LIPSNumPyClient, MyClient):
            def __init__(self, context, net, data):
                MyClient.__init__(self, net, data)
                LIPSNumPyClient.__init__(self, context=context)

    Each ``fit`` measures the local update ``w_after - w_received`` and reports
    its norms (``lips-update-norm`` metrics). When the server runs LIPS in
    client mode, on mask rounds the received model is masked with last round's
    update (magnitude when there is none) before the user's ``fit`` trains.
    State lives in ``context.state``, which outlives the ephemeral client
    objects of a simulation; with a ``lips-state-dir`` in the node config and
    a checkpointing server it is also kept on disk for a resumed run
    (:mod:`lips_flwr.clients.persist`). Flower sees the same optional methods
    (``evaluate``, ``get_parameters``, ``get_properties``) as the user's client
    implements.

    Parameters
    ----------
    client : NumPyClient, optional
        The user's client; omit it when subclassing.
    context : Context
        The ``Context`` given to ``client_fn``.
    param_names : list[str], optional
        Names of the arrays in the order they are exchanged (as given to
        ``LegacyLIPS``). Needed to keep tensors local by name.
    keep_local : str or sequence, optional
        Tensors that never take the server's value: ``"batchnorm"`` (FedBN,
        needs ``param_names`` including the running statistics), a sequence
        of names or glob patterns (needs ``param_names``), or of positions.
    """

    _lips_variant = False  # True on the classes _variant() makes

    def __new__(cls, *args: Any, **kwargs: Any) -> LIPSNumPyClient:
        """An instance of ``cls``, or of its variant without the optional methods the user's client lacks.

        Flower tells which optional methods a NumPyClient has from its class
        (``flwr``'s ``has_evaluate(client)`` is ``type(client).evaluate !=
        NumPyClient.evaluate``), and which ones this client has depends on the
        client it wraps (or, subclassed, on the classes after it): no instance
        attribute can say it. So the object is created as an instance of a
        subclass that puts NumPyClient's own methods back where the user's
        client has none (one such class per class and set of methods).
        """
        client = kwargs.get("client", args[0] if args else None)
        missing = set() if cls._lips_variant else _missing_methods(
            cls, client if isinstance(client, NumPyClient) else None)
        return super().__new__(_variant(cls, frozenset(missing)) if missing else cls)

    def __init__(
        self,
        client: NumPyClient | None = None,
        context: Context | None = None,
        *,
        param_names: Sequence[str] | None = None,
        keep_local: str | Sequence[str | int] | None = None,
    ) -> None:
        if client is not None and not isinstance(client, NumPyClient):
            raise ValueError(f"`client` must be a NumPyClient, got {type(client).__name__}")
        made_as = type(self).__mro__[1] if type(self)._lips_variant else type(self)  # the class called
        if client is None and made_as is LIPSNumPyClient:
            raise ValueError("`client` is required unless LIPSNumPyClient is subclassed")
        if not isinstance(context, Context):
            raise ValueError("`context` must be the flwr Context given to client_fn")
        if isinstance(param_names, str):
            raise ValueError("`param_names` must be a list of names, not one string")
        # Prefixed names: in subclass mode these live beside the user's attributes.
        self._lips_client = client
        self._lips_context = context
        self._lips_names = None if param_names is None else list(param_names)
        self._lips_local = self._resolve_local(keep_local)

    def _resolve_local(self, keep_local: object) -> list[str]:
        names = self._lips_names
        if keep_local is None:
            return []
        if isinstance(keep_local, str):
            if keep_local != "batchnorm":
                raise ValueError("`keep_local` must be 'batchnorm' or a sequence of names/positions")
            if names is None:
                raise ValueError("`keep_local='batchnorm'` needs `param_names` (the arrays' names in order)")
            found = batch_norm_names(dict.fromkeys(names, np.empty(0)))
            if not found:
                raise ValueError("`keep_local='batchnorm'` found no batch norm: `param_names` has "
                                 "no '*.running_mean' (send the whole state_dict)")
            return found
        items = list(keep_local)  # type: ignore[call-overload]
        if items and all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in items):
            if names is None:
                return [str(int(i)) for i in items]  # checked against the model in fit()
            bad = [i for i in items if not 0 <= i < len(names)]
            if bad:
                raise ValueError(f"`keep_local` positions {bad} are outside 0..{len(names) - 1}")
            return [names[int(i)] for i in items]
        if items and all(isinstance(i, str) for i in items):
            if names is None:
                raise ValueError("`keep_local` by name needs `param_names` (the arrays' names in order)")
            unmatched = [p for p in items if not fnmatch.filter(names, p)]
            if unmatched:
                raise ValueError(f"`keep_local` patterns {unmatched} match no name in `param_names`")
            return [n for n in names if any(fnmatch.fnmatch(n, p) for p in items)]
        raise ValueError("`keep_local` must be 'batchnorm', or a non-empty sequence of names or positions")

    def _inner(self, method: str) -> Callable:
        """The user's method: the wrapped client's, or the next class's when subclassed."""
        if self._lips_client is not None:
            return getattr(self._lips_client, method)
        return getattr(super(), method)

    def _named(self, parameters: NDArrays, source: str) -> dict[str, np.ndarray]:
        names = self._lips_names
        if names is None:
            names = [str(i) for i in range(len(parameters))]
        elif len(names) != len(parameters):
            raise ValueError(f"`param_names` has {len(names)} names but {source} "
                             f"{len(parameters)} arrays")
        unknown = [n for n in self._lips_local if n not in names]
        if unknown:
            raise ValueError(f"`keep_local` positions {unknown} are outside the model's "
                             f"{len(names)} arrays")
        return dict(zip(names, parameters))

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return self._inner("get_properties")(config)

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        return self._inner("get_parameters")(config)

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Restore local tensors, mask on client-mode mask rounds, train, track the update."""
        state = self._lips_context.state
        saved_at = state_path(self._lips_context, config)  # a resumed run: see clients.persist
        server_round = config_round(config)
        sent = self._named(parameters, "the server sent")
        if server_round is not None:  # a file of another model is not restored
            load_state(state, saved_at, server_round, {n: np.shape(a) for n, a in sent.items()})
        received = restore_local(state, sent, self._lips_local)
        start, mask_metrics, round_config = before_training(
            state, received, config, client_salt(self._lips_context)
        )
        trained, num_examples, metrics = self._inner("fit")(list(start.values()), config)
        named = self._named(trained, "the client's fit returned")
        save_local(state, named, self._lips_local)
        lips_metrics = after_training(state, start, named, round_config)
        if server_round is not None:
            save_state(state, saved_at, server_round)
        return trained, num_examples, {**(metrics or {}), **lips_metrics, **mask_metrics}

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        """Evaluate the received model with this client's local tensors restored."""
        named = self._named(parameters, "the server sent")
        server_round = config_round(config)
        if server_round is not None:
            load_state(self._lips_context.state, state_path(self._lips_context, config), server_round + 1,
                       {n: np.shape(a) for n, a in named.items()})
        restored = restore_local(self._lips_context.state, named, self._lips_local)
        return self._inner("evaluate")(list(restored.values()), config)


__all__ = ["LIPSNumPyClient"]
