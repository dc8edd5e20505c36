"""A checkpoint's metrics history, in a sidecar file appended a round at a time.

The Message API's strategies keep per-round metrics, which a resumed run's
``Result`` must cover from round 1. Rewriting all of them in every checkpoint
would write O(T^2) bytes over a run of T rounds, so they go to
``<checkpoint>.history.jsonl`` (:func:`history_path`): JSON lines, a header
naming the run, then one line a round and part, appended by :class:`HistoryLog`
and fsync'ed before the checkpoint that counts them is written. The ``.npz``
records how many bytes of the file belong to it (``Checkpoint.history_bytes``);
:func:`read_history` reads back that many, so the lines of a save that was cut
short before its checkpoint was written are ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._checks import check_metrics, checked_int
from .npz_store import remove_stale_temporaries, write_atomic

if TYPE_CHECKING:  # only for the annotation: .checkpoint imports this module
    from .checkpoint import Checkpoint

HISTORY_FORMAT = "lips-flwr-history"


def history_path(checkpoint_path: str | os.PathLike) -> Path:
    """``<checkpoint>.history.jsonl``: where the checkpoint's metrics history is appended."""
    return Path(os.fspath(checkpoint_path) + ".history.jsonl")


def read_history(
    checkpoint_path: str | os.PathLike, size: int, upto: int, run_key: str | None
) -> tuple[dict, bool, list[str]]:
    """``(history, whole, notes)``: the metrics in the first ``size`` bytes of the history file.

    ``history`` is ``part -> str(round) -> metrics`` for rounds ``<= upto``;
    a later line for the same part and round replaces an earlier one. Lines
    past ``size`` (a save that was cut short before its checkpoint was
    written) and a truncated last line are ignored. ``whole`` is false, with
    ``notes`` saying why, when the file is missing, shorter than ``size`` or
    another run's: the history then lacks rounds, which is not fatal.
    ``ValueError`` for a damaged line.
    """
    file = history_path(checkpoint_path)
    try:
        with open(file, "rb") as f:
            data = f.read(size)
    except FileNotFoundError:
        return {}, False, [f"its metrics history {str(file)!r} is missing: the result of the "
                           "resumed run lacks the metrics of the rounds before it"]
    except OSError as err:
        raise ValueError(f"cannot read the LIPS checkpoint's history {str(file)!r}: {err}") from err
    notes = []
    if len(data) < size:
        notes.append(f"its metrics history {str(file)!r} holds {len(data)} of its {size} bytes: the "
                     "result of the resumed run lacks the metrics of some rounds before it")
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: nothing, or a line cut short
    history: dict[str, dict[str, dict]] = {}
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line.decode("utf-8"))
            if number == 1:
                if not (isinstance(entry, dict) and entry.get("format") == HISTORY_FORMAT):
                    raise ValueError("not a LIPS metrics history")
                if entry.get("run_key") != run_key:
                    return {}, False, [f"its metrics history {str(file)!r} is another run's: the result "
                                       "of the resumed run lacks the metrics of the rounds before it"]
                continue
            part, server_round, metrics = entry["part"], checked_int(entry["round"]), entry["metrics"]
            if not isinstance(part, str):
                raise ValueError(f"malformed part {part!r}")
            check_metrics(server_round, metrics)
        except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as err:
            raise ValueError(f"the LIPS checkpoint's history {str(file)!r} is damaged: "
                             f"line {number}: {err}") from err
        if server_round <= upto:
            history.setdefault(part, {})[str(server_round)] = metrics
    if not lines:
        notes.append(f"its metrics history {str(file)!r} has no header")
    return history, not notes, notes


class HistoryLog:
    """A run's metrics history, appended to ``<checkpoint>.history.jsonl`` (JSON lines).

    The first line names the run (its key); each other line is one round's
    metrics of one part (``{"part", "round", "metrics"}``). :meth:`append`
    writes the entries not yet in the file, flushed and fsync'ed before the
    checkpoint that counts them is written: a save writes one round of
    metrics, however long the run.
    """

    def __init__(self, checkpoint_path: str | os.PathLike, run_key: str | None) -> None:
        self.path = history_path(checkpoint_path)
        self.run_key = run_key
        self.size: int | None = None  # the bytes of the file this run writes to; None: none yet
        self._written: dict[tuple[str, int], Any] = {}

    def adopt(self, checkpoint: Checkpoint) -> None:
        """Continue the history ``checkpoint`` was loaded with; lines past it (a cut-short save) go."""
        self.size, self._written = None, {}
        if checkpoint.history_bytes is None:
            return  # no usable file: the next append starts a new one with the whole history
        try:
            with open(self.path, "r+b") as f:
                f.truncate(checkpoint.history_bytes)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            return  # gone since it was read: the next append writes it anew
        self.size = checkpoint.history_bytes
        self._written = {(part, int(r)): metrics for part, rounds in (checkpoint.history or {}).items()
                         for r, metrics in rounds.items()}

    def append(self, history: Mapping[str, Mapping[int, Mapping]], upto: int) -> int:
        """Append the entries of rounds ``<= upto`` not yet in the file; the file's length.

        A file that is gone, or not as this run left it, is written anew, whole.
        """
        if self.size is not None and _size(self.path) != self.size:
            self.size = None
        if self.size is None:
            header = json.dumps({"format": HISTORY_FORMAT, "run_key": self.run_key}) + "\n"
            write_atomic(self.path, lambda f: f.write(header.encode("utf-8")))
            remove_stale_temporaries(self.path)
            self.size, self._written = len(header.encode("utf-8")), {}
        lines, written = [], {}
        for part, rounds in history.items():
            for server_round, metrics in rounds.items():
                if server_round > upto:
                    continue
                known = self._written.get((part, server_round), _UNSEEN)
                if known is metrics:
                    continue
                written[(part, server_round)] = metrics
                if known is not _UNSEEN and known == metrics:
                    continue  # e.g. the history a resumed run was given back
                entry = {"part": part, "round": server_round, "metrics": dict(metrics)}
                lines.append((json.dumps(entry) + "\n").encode("utf-8"))
        if lines:
            with open(self.path, "ab") as f:
                f.write(b"".join(lines))
                f.flush()
                os.fsync(f.fileno())
                self.size = f.tell()
        self._written.update(written)  # only once written: a failed append is tried again
        return self.size


_UNSEEN = object()  # no entry yet for a part and round: unlike any metrics, ``None`` included


def _size(path: Path) -> int | None:
    """The length of the file ``path`` in bytes; ``None`` when it is gone or cannot be read."""
    try:
        return path.stat().st_size
    except OSError:
        return None


__all__ = ["HISTORY_FORMAT", "HistoryLog", "history_path", "read_history"]
