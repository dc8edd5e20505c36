"""The LIPS server-side logic shared by both Flower strategy adapters.

:class:`TransientSparsifier` holds the validated hyperparameters and decides,
per round, what the adapters do: which config keys to send to clients and, in
server mode, how to sparsify the aggregate. It knows nothing of Flower: the
adapters convert records to ``name -> ndarray`` dicts and back.
"""

from __future__ import annotations

import json
import numbers
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .checkpoint import Checkpoint, settings_mismatch
from .inertia import InertiaTracker
from .layers import LayerSpec, candidate_names, is_candidate, select_layers, validate_layers
from .masking import model_update, sparsify
from .schedule import DECAYS, MaskSchedule
from .scores import validate_score
from .validation import arrays_mismatch, nonfinite_arrays

MODES = ("server", "client")
LIPS_OPTIONS = (
    "num_rounds", "tau0", "every", "start_round", "decay", "score", "layers", "mode", "seed",
    "inertia_t0",
)

# Keys of the per-round train config sent to clients (all start with "lips-").
KEY_ROUND = "lips-round"
KEY_MODE = "lips-mode"
KEY_TAU = "lips-tau"
KEY_SCORE = "lips-score"
KEY_SEED = "lips-seed"
KEY_LAYERS = "lips-layers"  # JSON list of positions in the model's order
KEY_RUN = "lips-run-key"  # names the run across restarts (clients persist their state under it)


class TransientSparsifier:
    """Validated LIPS hyperparameters and the per-round decisions.

    Parameters
    ----------
    num_rounds : int, optional
        ``T`` of the schedule. May be given later with :meth:`set_num_rounds`
        (the Message API adapter takes it from ``start(num_rounds=...)``).
    tau0 : float (default: 0.5)
        Scale of the schedule, in [0, 1): round ``r`` masks ``tau0 * decay((r-1)/T)``
        (so exactly ``tau0`` at round 1); ``0`` disables masking (the base strategy).
    every : int (default: 5)
        ``k``: mask every ``every`` rounds, >= 1.
    start_round : int (default: 1)
        First mask round, >= 1.
    decay : str (default: "linear")
        One of ``"linear"`` (paper), ``"cosine"``, ``"constant"``.
    score : str (default: "sensitivity")
        One of ``"sensitivity"`` (``|dw * w|``, paper), ``"magnitude"``, ``"random"``.
    layers : str, sequence of str or callable (default: "middle")
        See :func:`lips_flwr.layers.select_layers`.
    mode : str (default: "server")
        ``"server"``: sparsify the aggregate (paper). ``"client"``: send ``tau``
        to clients, which mask their own copy (the authors' code).
    seed : int (default: 0)
        Seed of the random score.
    inertia_t0 : int, optional
        Track layer-wise inertia (:class:`lips_flwr.inertia.InertiaTracker`)
        with this reference round (the paper uses 2); ``None``: off. Costs one
        pass over the model per round and two copies of its weight tensors.
    """

    def __init__(
        self,
        *,
        num_rounds: int | None = None,
        tau0: float = 0.5,
        every: int = 5,
        start_round: int = 1,
        decay: str = "linear",
        score: str = "sensitivity",
        layers: LayerSpec = "middle",
        mode: str = "server",
        seed: int = 0,
        inertia_t0: int | None = None,
    ) -> None:
        # Validate everything up front, even when num_rounds comes later.
        if num_rounds is None:  # validate the rest now; T comes with start()
            ok_start = isinstance(start_round, int) and start_round >= 1
            horizon = start_round if ok_start else 1
        else:
            horizon = num_rounds
        check = MaskSchedule(horizon, tau0, every, start_round, decay)
        self.tau0 = check.tau0
        self.every = check.every
        self.start_round = check.start_round
        self.decay = decay
        self.score = validate_score(score)
        self.layers = validate_layers(layers)
        if mode not in MODES:
            raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}")
        self.mode = mode
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"`seed` must be a non-negative integer, got {seed!r}")
        self.seed = int(seed)
        self._schedule: MaskSchedule | None = None
        if num_rounds is not None:
            self.set_num_rounds(num_rounds)
        self._layer_cache: tuple[tuple, list[str]] | None = None
        self.inertia = None if inertia_t0 is None else InertiaTracker(inertia_t0)
        # Set by the adapters when they checkpoint: a new run gets a new key, a resumed one keeps it.
        self.run_key: str | None = None

    def new_run_key(self) -> None:
        """Name a fresh run (one that checkpoints) for the clients' persisted state."""
        self.run_key = uuid.uuid4().hex

    def needs_aggregate(self, server_round: int) -> bool:
        """Whether the adapters must hand this round's aggregate over as numpy."""
        return self.masks_aggregate(server_round) or self.inertia is not None

    def observe(self, server_round: int, model: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Inertia metrics of the model broadcast after ``server_round`` (empty when off)."""
        if self.inertia is None:
            return {}
        return self.inertia.update(server_round, model, candidate_names(model))

    def set_num_rounds(self, num_rounds: int) -> None:
        """Fix ``T``, the schedule's horizon."""
        self._schedule = MaskSchedule(num_rounds, self.tau0, self.every, self.start_round, self.decay)

    @property
    def num_rounds(self) -> int | None:
        return None if self._schedule is None else self._schedule.num_rounds

    @property
    def schedule(self) -> MaskSchedule:
        if self._schedule is None:
            raise ValueError(
                "LIPS does not know `num_rounds`: pass num_rounds=... to the LIPS "
                "strategy, or run it through strategy.start(num_rounds=...)"
            )
        return self._schedule

    def layer_names(self, arrays: Mapping[str, np.ndarray]) -> list[str]:
        """The tensors to sparsify in this model.

        The choice is made on the first model seen with these names and
        shapes (the adapters show the initial global model first) and kept
        while they stay the same, whatever the dtypes become: Flower's
        Message API FedAvg returns integer buffers as float64, which must not
        make them eligible from round 2 on. A kept layer is skipped in a model
        where it is no longer eligible.
        """
        signature = tuple((n, np.shape(a)) for n, a in arrays.items())
        if self._layer_cache is None or self._layer_cache[0] != signature:
            self._layer_cache = (signature, select_layers(arrays, self.layers))
        return [n for n in self._layer_cache[1] if is_candidate(n, arrays[n])]

    def client_config(self, server_round: int, arrays: Mapping[str, np.ndarray]) -> dict:
        """The ``lips-*`` keys of this round's train config."""
        config: dict = {KEY_ROUND: server_round, KEY_MODE: self.mode}
        if self.run_key is not None:
            config[KEY_RUN] = self.run_key
        if self.mode == "client":
            tau = self.schedule.tau(server_round)
            config[KEY_TAU] = tau
            if tau > 0.0:
                position = {name: i for i, name in enumerate(arrays)}
                config[KEY_SCORE] = self.score
                config[KEY_SEED] = self.seed
                config[KEY_LAYERS] = json.dumps([position[n] for n in self.layer_names(arrays)])
        return config

    def evaluate_config(self, server_round: int) -> dict:
        """The ``lips-*`` keys of the evaluate config: the run key and round, when checkpointing."""
        return {} if self.run_key is None else {KEY_RUN: self.run_key, KEY_ROUND: server_round}

    def masks_aggregate(self, server_round: int) -> bool:
        """Whether the aggregate of ``server_round`` is sparsified on the server."""
        return self.mode == "server" and self.schedule.tau(server_round) > 0.0

    def after_aggregation(
        self,
        server_round: int,
        aggregate: Mapping[str, np.ndarray],
        previous: Mapping[str, np.ndarray] | None,
        *,
        on_skip: Callable[[str], None] | None = None,
    ) -> tuple[dict[str, np.ndarray] | None, dict[str, int | float]]:
        """Sparsify the aggregate of a mask round (server mode).

        Returns the sparsified model, or ``None`` when nothing changes (client
        mode, rounds that are not mask rounds, ``tau == 0``), and the round's
        ``lips-*`` metrics.

        An aggregate with NaN or Inf in a floating-point tensor (or whose
        update ``dw`` has them in a layer to mask) is not masked: ranking
        garbage would hide it. The round then reports ``lips-mask-round`` 0
        and ``lips-skipped`` 1, and ``on_skip`` is called with the reason.
        """
        start = time.perf_counter()
        tau = self.schedule.tau(server_round)
        metrics: dict[str, int | float] = {
            # A scheduled round whose tau is 0 (tau0=0, past T) masks nothing: not a mask round.
            "lips-mask-round": int(tau > 0.0),
            "lips-tau": tau,
        }
        masked, zeros = None, {}
        if self.masks_aggregate(server_round):
            layers = self.layer_names(aggregate)
            updates = None
            if self.score == "sensitivity" and previous is None:
                raise RuntimeError(
                    "LIPS needs the previous global model to compute the update "
                    "dw; configure_train was not called before aggregate_train"
                )
            reason = _nonfinite_reason("the aggregate", aggregate)
            if reason is None and self.score == "sensitivity":
                updates = model_update(aggregate, previous, layers)
                reason = _nonfinite_reason(
                    "the update dw (aggregate - previous global model)", updates)
            if reason is None:
                masked, zeros = sparsify(
                    aggregate,
                    layers,
                    tau,
                    score=self.score,
                    updates=updates,
                    seed=self.seed,
                    salt=(server_round,),
                )
            else:
                metrics["lips-mask-round"] = 0
                metrics["lips-skipped"] = 1
                if on_skip is not None:
                    on_skip(reason)
        metrics["lips-zeros"] = int(sum(zeros.values()))
        metrics["lips-layers-masked"] = len(zeros)
        metrics.update({f"lips-zeros/{name}": int(z) for name, z in zeros.items()})
        metrics["lips-seconds"] = time.perf_counter() - start
        return masked, metrics

    def settings(self) -> dict:
        """The hyperparameters a resumed run must share with the checkpoint (JSON-able)."""
        layers = self.layers
        if callable(layers):
            layers = f"callable {getattr(layers, '__qualname__', type(layers).__name__)}"
        return {
            "tau0": self.tau0, "every": self.every, "start_round": self.start_round,
            "decay": self.decay, "score": self.score,
            "layers": layers if isinstance(layers, str) else list(layers),
            "mode": self.mode, "seed": self.seed,
            "inertia_t0": None if self.inertia is None else self.inertia.t0,
        }

    def checkpoint(self, server_round: int, model: Mapping[str, np.ndarray]) -> Checkpoint:
        """The sparsifier's part of a checkpoint after ``server_round``; ``model`` is the broadcast one."""
        return Checkpoint(
            round=server_round,
            num_rounds=self.schedule.num_rounds,
            settings=self.settings(),
            model=dict(model),
            layers=None if self._layer_cache is None else list(self._layer_cache[1]),
            inertia=None if self.inertia is None else self.inertia.state(),
            run_key=self.run_key,
        )

    def resume_from(self, checkpoint: Checkpoint) -> None:
        """Take the schedule position, layer choice and inertia series of ``checkpoint``.

        Raises ``ValueError`` naming every difference when the checkpoint was
        written with other hyperparameters or another ``num_rounds``: it would
        not continue the same schedule.
        """
        problems = settings_mismatch(checkpoint.settings, self.settings())
        if self.num_rounds is not None and checkpoint.num_rounds != self.num_rounds:
            problems.append(f"num_rounds: checkpoint {checkpoint.num_rounds}, now {self.num_rounds}")
        if not 0 <= checkpoint.round <= checkpoint.num_rounds:
            problems.append(f"round {checkpoint.round} is outside 0..{checkpoint.num_rounds}")
        if problems:
            raise ValueError(
                "the checkpoint was written by a LIPS strategy with other settings; "
                "resuming would not continue the same schedule: " + "; ".join(problems)
            )
        if self.num_rounds is None:
            self.set_num_rounds(checkpoint.num_rounds)
        if checkpoint.layers is not None:
            signature = tuple((n, np.shape(a)) for n, a in checkpoint.model.items())
            self._layer_cache = (signature, list(checkpoint.layers))
        if self.inertia is not None and checkpoint.inertia is not None:
            self.inertia.load_state(checkpoint.inertia)
        self.run_key = checkpoint.run_key

    def describe(self) -> list[tuple[str, object]]:
        """(label, value) pairs for the adapters' ``summary()`` log tree."""
        rounds = self._schedule.mask_rounds() if self._schedule else "after start()"
        if isinstance(rounds, list) and len(rounds) > 8:
            rounds = f"{rounds[:4]} ... {rounds[-1]} ({len(rounds)} rounds)"
        layers = self.layers if isinstance(self.layers, (str, tuple)) else "custom predicate"
        return [
            ("Mode", self.mode),
            ("Schedule", f"tau0={self.tau0}, every={self.every}, decay={self.decay}, "
                         f"start_round={self.start_round}, num_rounds={self.num_rounds}"),
            ("Mask rounds", rounds),
            ("Score", self.score),
            ("Layers", layers),
            ("Seed", self.seed),
            ("Inertia metrics", "off" if self.inertia is None else f"t0={self.inertia.t0}"),
        ]


def _nonfinite_reason(what: str, arrays: Mapping[str, np.ndarray]) -> str | None:
    """Why ``arrays`` must not be ranked (NaN/Inf in a float tensor), or ``None``."""
    bad = nonfinite_arrays(arrays)
    return f"{what} has NaN or Inf in {bad[:5]}" if bad else None


__all__: Sequence[str] = (
    "TransientSparsifier",
    "LIPS_OPTIONS",
    "arrays_mismatch",
    "MODES",
    "DECAYS",
)
