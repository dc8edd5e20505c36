"""Continuing a stopped run exactly, or not at all: the clients' state and the checks of a staging folder.

A run on the batched Grid is continued from three things in its staging
folder: the strategy's checkpoint (the app's ``checkpoint-path``), the
runner's observations (``observed.json``, ``last-global.npz``) and the
clients' state. The app's own client-state files (``lips-state-dir``) keep
only what :func:`~lips_flwr.clients.persistent_state_mod` keeps, and only
when the app declares that key: a FedBN client of an app without it would
continue with the global batch-norm tensors, and the run would end elsewhere
under the same identity. So the runner keeps every node's whole
``context.state`` itself (:class:`ClientContexts`): after each delivery of
replies (before the strategy sees them, so before it checkpoints that round),
``client-contexts/round-<r>.npz`` holds each node's state after round ``r``;
a continued run starting at round ``k`` gets round ``k - 1``'s back before
any client runs. A stopped run is continued whole or not at all
(:func:`claim_staging`).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...persistence.npz_store import read_groups, write_groups
from .runs import PreparedRun, not_resumable, staged_code_changes
from .store import IDENTITY, LAST_GLOBAL, OBSERVED, SEGMENTS, staged_identity

CONTEXTS = "client-contexts"
FORMAT = "lips-flwr-client-contexts/1"
KEEP = 3  # rounds of client state kept: a stop may fall before the strategy checkpointed the last one


def contexts_path(staging: Path, rnd: int) -> Path:
    """Where the clients' state after round ``rnd`` is kept."""
    return staging / CONTEXTS / f"round-{rnd}.npz"


def save_contexts(staging: Path, rnd: int, contexts: dict[int, Any]) -> None:
    """Keep each node's ``context.state`` after round ``rnd``; drop rounds older than :data:`KEEP`."""
    from flwr.common.serde import recorddict_to_proto

    states = {str(node): np.frombuffer(recorddict_to_proto(context.state).SerializeToString(), np.uint8)
              for node, context in contexts.items()}
    write_groups(contexts_path(staging, rnd), {"nodes": states}, {"format": FORMAT, "round": rnd})
    for old in (staging / CONTEXTS).glob("round-*.npz"):
        number = old.stem.removeprefix("round-")
        if number.isdigit() and int(number) <= rnd - KEEP:
            old.unlink(missing_ok=True)


def load_contexts(staging: Path, rnd: int) -> dict[int, Any]:
    """Each node's state after round ``rnd``, as kept (``ValueError`` naming the file when unreadable)."""
    from flwr.common.serde import recorddict_from_proto
    from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

    path = contexts_path(staging, rnd)
    groups, meta = read_groups(path, "runner's copy of the clients' state")
    if meta.get("format") != FORMAT or meta.get("round") != rnd or "nodes" not in groups:
        raise ValueError(f"{str(path)!r} is not the clients' state after round {rnd}")
    states = {}
    for node, data in groups["nodes"].items():
        proto = RecordDictProto()
        try:
            proto.ParseFromString(data.tobytes())
            states[int(node)] = recorddict_from_proto(proto)
        except Exception as err:  # protobuf's DecodeError, a malformed record
            raise ValueError(f"{str(path)!r} is damaged: node {node}: {err}") from err
    return states


class ClientContexts:
    """A Grid observer that keeps the clients' state of a run and gives it back to a continued run.

    It wraps the runner's observer (``inner``): each delivery's replies go to
    it after the clients' state is kept. ``attach(grid)`` gives it the
    Grid's node contexts before the ServerApp starts. With ``resuming``, the
    first train instructions restore the state (see the module docstring).
    """

    def __init__(self, inner: Any, staging: Path, resuming: bool) -> None:
        self.inner, self.staging, self.resuming = inner, staging, resuming
        self.contexts: dict[int, Any] = {}
        self.round: int | None = None  # the round of the latest instructions
        self.restored_from: int | None = None  # the round whose state a continued run started from

    def attach(self, grid: Any) -> None:
        self.contexts = grid.contexts

    def pushed(self, messages: Sequence[Any]) -> None:
        from ..batched.calls import round_of

        rounds = [r for r in (round_of(m) for m in messages) if r is not None]
        if rounds:
            self.round = max(rounds)
        trains = [r for m, r in zip(messages, map(round_of, messages))
                  if r is not None and m.metadata.message_type.split(".")[0] == "train"]
        if self.resuming and trains:
            self.resuming = False  # (only the first train instructions of a continued run)
            self._restore(min(trains) - 1)
        self.inner.pushed(messages)

    def _restore(self, rnd: int) -> None:
        self.restored_from = rnd
        if rnd < 1:
            return
        for node, state in load_contexts(self.staging, rnd).items():
            if node in self.contexts:  # (in place: a mod may hold the node's RecordDict)
                kept = self.contexts[node].state
                for key in list(kept.keys()):
                    del kept[key]
                for key, record in state.items():
                    kept[key] = record

    def replied(self, replies: Sequence[Any]) -> None:
        if self.round is not None and self.contexts:
            save_contexts(self.staging, self.round, self.contexts)
        self.inner.replied(replies)


# --------------------------------------------------------------------------- the staging folder's checks


def _observed_problem(path: Path, checkpoint_round: int) -> str | None:
    if not path.exists():
        return f"{str(path)!r} is missing" if checkpoint_round else None
    try:
        data = json.loads(path.read_text())
        rounds = {int(r): entry for r, entry in data["rounds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"{str(path)!r} is unreadable or damaged ({type(err).__name__}: {err})"
    lacking = [r for r in range(1, checkpoint_round + 1) if "train" not in rounds.get(r, {})]
    if lacking:
        return (f"{str(path)!r} lacks round {lacking[0]}, which the checkpoint holds (round "
                f"{checkpoint_round})")
    return None


def _last_global_problem(path: Path, checkpoint_round: int) -> str | None:
    if not path.exists():
        return f"{str(path)!r} is missing" if checkpoint_round > 1 else None
    try:
        with np.load(path, allow_pickle=False) as saved:
            arrays = {name: saved[name] for name in saved.files}
            saved_round = int(arrays["__round__"])
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
        return f"{str(path)!r} is unreadable or damaged ({type(err).__name__}: {err})"
    if saved_round < checkpoint_round - 1:
        return (f"{str(path)!r} holds the model of round {saved_round}, older than the checkpoint's round "
                f"{checkpoint_round} allows")
    return None


def _checkpoint_round(path: Path) -> tuple[int, str | None]:
    """``(round, problem)`` of the strategy's checkpoint; round 0 when there is none yet."""
    from ...persistence.checkpoint import load_checkpoint

    if not path.exists():
        return 0, None
    try:
        checkpoint = load_checkpoint(path)
    except (OSError, ValueError) as err:
        return 0, f"{str(path)!r} is unreadable or damaged ({err})"
    if checkpoint.notes:
        return 0, f"{str(path)!r} is incomplete ({'; '.join(checkpoint.notes)})"
    return checkpoint.round, None


def _client_files_problem(folder: Path) -> str | None:
    """The app's own client-state files (``lips-state-dir``): each must read whole."""
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.npz")):
        try:
            read_groups(path, "LIPS client state")
        except (OSError, ValueError) as err:
            return f"{str(path)!r} is unreadable or damaged ({err})"
    return None


def staging_problem(staging: Path, run_config: dict[str, Any]) -> str | None:
    """Why a stopped run's staging folder cannot be continued exactly (a file named); ``None``: it can."""
    checkpoint = run_config.get("checkpoint-path")
    rnd, problem = _checkpoint_round(Path(str(checkpoint))) if checkpoint else (0, None)
    problem = (problem or _observed_problem(staging / OBSERVED, rnd)
               or _last_global_problem(staging / LAST_GLOBAL, rnd) or _segments_problem(staging / SEGMENTS))
    if problem:
        return problem
    if rnd:
        try:
            load_contexts(staging, rnd)
        except (OSError, ValueError) as err:
            return f"the clients' state after round {rnd} cannot be read ({err})"
    state_dir = run_config.get("lips-state-dir")
    return _client_files_problem(Path(str(state_dir))) if state_dir else None


def _segments_problem(path: Path) -> str | None:
    if not path.exists():
        return None
    try:
        segments = json.loads(path.read_text())["segments"]
        if not isinstance(segments, list):
            raise TypeError("segments is not a list")
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{str(path)!r} is unreadable or damaged ({type(err).__name__}: {err})"
    return None


def claim_staging(job: PreparedRun, progress: Callable[[str], None]) -> bool:
    """Make ``job``'s staging folder its own; ``True`` when it continues a stopped run of its identity.

    A stopped run is continued only whole: when the app can resume
    (:func:`~.runs.not_resumable`) and every file it would continue from
    reads whole and agrees with the checkpoint (:func:`staging_problem`).
    Otherwise the folder is removed and the run starts at round 1, with one
    line saying why.
    """
    identity = json.loads(json.dumps(job.identity))
    if job.staging.exists():
        if staged_identity(job.staging) != identity:
            why = "it holds a run with another identity"
        elif changed := staged_code_changes(job):
            why = f"the app's code it ran changed: {', '.join(changed)}"
        else:
            why = not_resumable(job.run_config, job.identity["engine"]) or staging_problem(
                job.staging, job.run_config) or ""
            if not why:
                progress(f"[{job.name}] continuing its stopped run ({str(job.staging)!r})")
                return True
        progress(f"[{job.name}] removing {str(job.staging)!r} ({why}): starting at round 1")
        shutil.rmtree(job.staging)
    job.staging.mkdir(parents=True)
    (job.staging / IDENTITY).write_text(json.dumps(identity, indent=1, sort_keys=True))
    return False


__all__ = ["CONTEXTS", "ClientContexts", "claim_staging", "contexts_path", "load_contexts", "save_contexts",
           "staging_problem"]
