"""A run of a Flower App as the runner sees it: its spec, its identity, its place on disk.

A :class:`RunSpec` says what to run (an App folder, run-config overrides, a
seed, a node count, an engine, LIPS forced off or not) and what to call the
result. :func:`prepare` resolves it before anything runs: the app's run
config with Flower's rules, the engine (``auto``: ``stacked`` on CUDA, else
``sequential``), and the run's **identity**, everything that decides its
numbers::

    {"app": {"name", "digest"}, "run_config": {...}, "seed", "num_nodes", "engine",
     "lips_forced": {"tau0": 0.0} or {}, "code": {"lips_flwr", "source"}}

and, on the stacked engine only, ``"chunk_size"`` (the most clients trained
at once, ``None`` for a whole round: it changes the numbers, to rounding;
a chunk halved on a CUDA out-of-memory error is not known beforehand and
is not in it). The app's ``digest`` covers its ``pyproject.toml`` and its
components' packages; the run's process adds ``app.modules`` once the run
has ended, each module it loaded from the App folder with the digest of its
code (:func:`~.apps.loaded_modules`; under ``flwr run``, every ``.py`` file
of the folder). A result is reused only while each of those files has that
digest still (:func:`identity_now`). The digests are of the code, not of the
bytes (:func:`~.apps.code_content`), and paths are relative to the App folder.

Library versions and hardware are provenance (:mod:`.provenance`), not
identity. **Runner-managed keys**: when the app's run config declares
``results-path``, ``checkpoint-path``, ``resume`` or ``lips-state-dir``, the
runner sets them (files in the run's staging folder, ``resume = "auto"``),
they are left out of the identity, and an override of one is refused. When
it declares ``seed``, the runner sets it to the run's seed. A spec's
``location_keys`` (e.g. ``dataset-path``: where the data is, not what it is)
are left out of the identity too and recorded in the provenance.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .apps import (
    FlowerApp,
    app_digest,
    load_app,
    module_digests,
    planned_identity,
    resolve_run_config,
    with_modules,
)
from .provenance import code_identity
from .store import check_name, result_path, staging_path

MODULES = "modules.json"  # in a run's staging folder: the app modules its process loaded, by digest
MANAGED_KEYS = ("results-path", "checkpoint-path", "resume", "lips-state-dir")
ENGINES = ("auto", "sequential", "stacked", "flwr")
LIPS_OFF = {"tau0": 0.0}  # LIPS with tau0 = 0 is its wrapped strategy, bit for bit


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep (see the module docstring).

    ``env``: the run process's environment additions (thread counts), set
    before its imports; ``chunk_size``: the stacked engine's most clients at
    once; ``require_evaluate``: the run fails when no round was evaluated;
    ``client_resources``: ``flwr run``'s ``client-resources-*`` (engine ``"flwr"``).
    """

    app: str | Path
    name: str
    seed: int
    overrides: Mapping[str, Any] = field(default_factory=dict)
    num_nodes: int = 10
    engine: str = "auto"
    lips_off: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    chunk_size: int | None = None
    location_keys: tuple[str, ...] = ()
    require_evaluate: bool = False
    client_resources: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PreparedRun:
    """A spec resolved: the run config the app gets, the identity, the files, whether it can resume."""

    spec: RunSpec
    app: FlowerApp
    run_config: dict[str, Any]
    identity: dict[str, Any]
    result: Path
    staging: Path
    resumable: bool
    num_rounds: int | None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def locations(self) -> dict[str, Any]:
        return {key: self.run_config[key] for key in self.spec.location_keys}


def resolve_engine(engine: str) -> str:
    """``engine`` with ``auto`` made concrete (``stacked`` on CUDA, else ``sequential``)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine != "auto":
        return engine
    import torch

    return "stacked" if torch.cuda.is_available() else "sequential"


def _check_spec(spec: RunSpec, app: FlowerApp) -> None:
    check_name(spec.name)
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, int) or spec.seed < 0:
        raise ValueError(f"{spec.name}: the seed must be an integer >= 0, got {spec.seed!r}")
    if isinstance(spec.num_nodes, bool) or not isinstance(spec.num_nodes, int) or spec.num_nodes < 1:
        raise ValueError(f"{spec.name}: the node count must be an integer >= 1, got {spec.num_nodes!r}")
    managed = sorted(set(spec.overrides) & set(MANAGED_KEYS))
    if managed:
        raise ValueError(f"{spec.name}: run-config keys {managed} are managed by the runner (it keeps the "
                         "app's results, checkpoint and client state in the run's staging folder and resumes "
                         "a stopped run itself): leave them out")
    if "seed" in spec.overrides and spec.overrides["seed"] != spec.seed:
        raise ValueError(f"{spec.name}: run-config seed={spec.overrides['seed']!r} differs from the run's "
                         f"seed {spec.seed}; the runner sets the app's seed key to the run's seed")
    if spec.lips_off and spec.engine == "flwr":  # `flwr run` builds the app where no forcing reaches
        raise ValueError(f"{spec.name}: a LIPS-off run (lips_off=True) needs the batched Grid; `flwr run` "
                         "(engine 'flwr') would run the app with LIPS as written")
    unknown = sorted(set(spec.location_keys) - set(app.defaults))
    if unknown:
        raise ValueError(f"{spec.name}: location keys {unknown} are not run-config keys of {app.name}")


def prepare(spec: RunSpec, out: Path) -> PreparedRun:
    """Resolve ``spec`` for a sweep into ``out`` (``ValueError`` naming what is wrong; nothing runs)."""
    app = load_app(spec.app)
    _check_spec(spec, app)
    engine = resolve_engine(spec.engine)
    staging = staging_path(out, spec.name)
    config = resolve_run_config(app, dict(spec.overrides))
    if "seed" in config:
        config["seed"] = spec.seed
    managed = {"results-path": str(staging / "app-results.json"), "resume": "auto",
               "checkpoint-path": str(staging / "checkpoint.npz"), "lips-state-dir": str(staging / "clients")}
    for key, value in managed.items():
        if key in config:
            config[key] = value
    hidden = {*MANAGED_KEYS, *spec.location_keys}
    identity = {
        "app": {"name": app.name, "digest": app_digest(app)},
        "run_config": {k: v for k, v in config.items() if k not in hidden},
        "seed": spec.seed,
        "num_nodes": spec.num_nodes,
        "engine": engine,
        "lips_forced": dict(LIPS_OFF) if spec.lips_off else {},
        "code": code_identity(),
    }
    if engine == "stacked":  # (the sequential engine has no chunks: its identities stay as they were)
        identity["chunk_size"] = spec.chunk_size
    rounds = config.get("num-server-rounds")
    rounds = rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else None
    return PreparedRun(spec=spec, app=app, run_config=config, identity=identity,
                       result=result_path(out, spec.name), staging=staging,
                       resumable=not_resumable(config, engine) is None,
                       num_rounds=rounds)


def run_name(arm: str, seed: int) -> str:
    """The result name of ``arm``'s run with ``seed``: ``"<arm>-seed<seed>"`` (``arm`` may be ``conf/b``)."""
    return f"{arm}-seed{seed}"


def identity_now(job: PreparedRun, found: dict[str, Any]) -> dict[str, Any]:
    """``job``'s identity as a result file's ``found`` one must equal it to be reused.

    The app modules ``found`` recorded (``app.modules``) are digested again
    from the files on disk now, so that a changed (or removed) one is a
    difference named by its path; a ``found`` without them is compared as it
    is (a result written before modules were recorded).
    """
    app = found.get("app")
    modules = app.get("modules") if isinstance(app, dict) else None
    if not isinstance(modules, dict):
        return job.identity
    return with_modules(planned_identity(job.identity), module_digests(job.app, modules))


def staged_code_changes(job: PreparedRun) -> list[str]:
    """What of the app's code a stopped run in ``job``'s staging folder loaded differs on disk now.

    The files of its :data:`MODULES` whose code changed (or is gone), or that
    file itself when it is unreadable; ``[]`` when it has none (the run
    stopped before its imports were done).
    """
    path = job.staging / MODULES
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict):
        return [f"{MODULES} (unreadable)"]
    now = module_digests(job.app, saved)
    return sorted(name for name, digest in saved.items() if now[name] != digest)


def not_resumable(config: Mapping[str, Any], engine: str) -> str | None:
    """Why a stopped run of this config and engine starts again rather than continues; ``None``: it can.

    The runner continues a run only when it can restore all of its state:
    the strategy's from the app's checkpoint (``checkpoint-path`` and
    ``resume``), the clients' from its own copy of their contexts, which it
    keeps on the batched Grid only (:mod:`.resume`).
    """
    if engine == "flwr":
        return "runs under `flwr run` are not continued: the runner cannot keep their clients' state"
    if "checkpoint-path" not in config or "resume" not in config:
        return "the app cannot resume: its run config declares no checkpoint-path and resume keys"
    return None


def legacy_run_config(run_config: dict[str, Any], location_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """An earlier session's embedded run config as an identity's (managed and location keys dropped)."""
    return {k: v for k, v in run_config.items() if k not in (*MANAGED_KEYS, *location_keys)}


__all__ = ["ENGINES", "LIPS_OFF", "MANAGED_KEYS", "MODULES", "PreparedRun", "RunSpec", "identity_now",
           "legacy_run_config", "not_resumable", "prepare", "resolve_engine", "run_name",
           "staged_code_changes"]
