"""LIPS for legacy ``NumPyClient`` apps: a wrapper that tracks local update deltas."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

import numpy as np
from flwr.app import Context
from flwr.client import NumPyClient
from flwr.common import NDArrays, Scalar

from ..layers import batch_norm_names
from .state import after_training, before_training, restore_local, save_local


class LIPSNumPyClient(NumPyClient):
    """Wrap a user's ``NumPyClient``: delta tracking, client-mode masking, FedBN.

    ``client_fn`` changes by one line::

        return LIPSNumPyClient(MyClient(net, data), context).to_client()

    Each ``fit`` measures the local update ``w_after - w_received`` and reports
    its norms (``lips-update-norm`` metrics). When the server runs LIPS in
    client mode, on mask rounds the received model is masked with last round's
    update (magnitude when there is none) before the wrapped client trains.
    State is kept in ``context.state``, which outlives the ephemeral client
    objects of a simulation.

    Parameters
    ----------
    client : NumPyClient
        The user's client; its ``fit``/``evaluate`` receive the (masked) arrays.
    context : Context
        The ``Context`` given to ``client_fn``.
    param_names : list[str], optional
        Names of the arrays in the order they are exchanged (as given to
        ``LegacyLIPS``). Needed for ``keep_local="batchnorm"``.
    keep_local : str or sequence, optional
        Tensors that never take the server's value: ``"batchnorm"`` (FedBN,
        needs ``param_names`` with the running statistics), a sequence of
        names or glob patterns (needs ``param_names``), or of positions.
    """

    def __init__(
        self,
        client: NumPyClient,
        context: Context,
        *,
        param_names: Sequence[str] | None = None,
        keep_local: str | Sequence[str | int] | None = None,
    ) -> None:
        if not isinstance(client, NumPyClient):
            raise ValueError(f"`client` must be a NumPyClient, got {type(client).__name__}")
        self.client = client
        self.context = context
        self.param_names = None if param_names is None else list(param_names)
        self._local = self._resolve_local(keep_local)

    def _resolve_local(self, keep_local) -> list[str]:
        if keep_local is None:
            return []
        if all(isinstance(k, int) for k in keep_local) and not isinstance(keep_local, str):
            return [str(k) for k in keep_local]
        if self.param_names is None:
            raise ValueError("`keep_local` by name needs `param_names` (the arrays' names in order)")
        if keep_local == "batchnorm":
            names = batch_norm_names(dict.fromkeys(self.param_names, np.empty(0)))
            if not names:
                raise ValueError("`keep_local='batchnorm'` found no batch norm: `param_names` has "
                                 "no '*.running_mean' (send the whole state_dict)")
            return names
        if isinstance(keep_local, str):
            raise ValueError("`keep_local` must be 'batchnorm' or a sequence of names/positions")
        return [n for n in self.param_names if any(fnmatch.fnmatch(n, p) for p in keep_local)]

    def _named(self, parameters: NDArrays) -> dict[str, np.ndarray]:
        names = self.param_names
        if names is None:
            names = [str(i) for i in range(len(parameters))]
        elif len(names) != len(parameters):
            raise ValueError(f"`param_names` has {len(names)} names but the server sent "
                             f"{len(parameters)} arrays")
        return dict(zip(names, parameters))

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return self.client.get_properties(config)

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        return self.client.get_parameters(config)

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Restore local tensors, mask on client-mode mask rounds, train, track the update."""
        state = self.context.state
        received = restore_local(state, self._named(parameters), self._local)
        start, mask_metrics, round_config = before_training(
            state, received, config, (self.context.node_id,)
        )
        trained, num_examples, metrics = self.client.fit(list(start.values()), config)
        named = self._named(trained)
        save_local(state, named, self._local)
        lips_metrics = after_training(state, start, named, round_config)
        return trained, num_examples, {**(metrics or {}), **lips_metrics, **mask_metrics}

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        """Evaluate the received model with this client's local tensors restored."""
        restored = restore_local(self.context.state, self._named(parameters), self._local)
        return self.client.evaluate(list(restored.values()), config)
