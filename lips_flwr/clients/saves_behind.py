"""Client state files written behind the next client's call: the batched Grid's :func:`saves_behind`.

An engine that runs many clients in one process (the batched Grid) opens
:func:`saves_behind` around one delivery's calls: within it,
:func:`lips_flwr.clients.persist.save_state` hands each file to the block's
thread (:func:`write_behind`), which writes them in order while the next
clients run, and the block waits for every file before the replies go on to
the strategy, whose checkpoint is thus never newer than the clients' files.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from logging import ERROR
from pathlib import Path

from flwr.common import log


class _Writer:
    """A thread, started at the first write, that runs the writes handed to it in order until closed."""

    def __init__(self) -> None:
        self._writes: queue.SimpleQueue[tuple[Path, Callable[[], None]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # a write is either taken before close() or refused after it
        self._open = True
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None  # the first a write raised (beyond the OS errors it logs)
        self.writing: Path | None = None  # the file being written, named when a wait runs out

    def take(self, path: Path, write: Callable[[], None]) -> bool:
        """Queue ``write`` of ``path``; ``False`` once closed (the caller then writes it itself)."""
        with self._lock:
            if self._open:
                if self._thread is None:  # (a daemon: a write stuck on a dead mount keeps no process alive)
                    self._thread = threading.Thread(target=self._run, name="lips-flwr client state",
                                                    daemon=True)
                    self._thread.start()
                self._writes.put((path, write))
            return self._open

    def close(self, timeout: float | None) -> bool:
        """Take no more writes; wait at most ``timeout`` s for those taken: whether all are written."""
        with self._lock:
            self._open = False
            if self._thread is None:
                return True
            self._writes.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (item := self._writes.get()) is not None:
            self.writing, write = item
            try:
                write()
            except BaseException as err:  # noqa: BLE001 - raised by saves_behind, in its caller's thread
                self.error = self.error or err
        self.writing = None


_BEHIND: ContextVar[_Writer | None] = ContextVar("lips_flwr_client_saves_behind", default=None)


@contextmanager
def saves_behind(timeout: float | None = None) -> Iterator[None]:
    """Within the block, :func:`~.persist.save_state` hands its file to the block's thread and returns.

    For this context and the contexts copied from it (the batched Grid's
    client threads). One thread writes the files, one after another, in the
    order the saves were made. Leaving the block waits until every one is
    written (an OS error logged as :func:`~.persist.save_state` logs it), at most
    ``timeout`` seconds (``None``: no limit), then raises a ``TimeoutError``
    naming the file still being written, or else the first other error a
    write raised. When the block ends by an exception, that one goes on, and
    a write's error is logged. A save made after the block ended (a call
    that ran past its timeout) is written by its caller, as outside the block.
    """
    writer = _Writer()
    token = _BEHIND.set(writer)
    try:
        yield
    except BaseException:
        _BEHIND.reset(token)
        if writer.close(timeout) and writer.error is not None:
            log(ERROR, "LIPS: a client state file was not written: %s: %s", type(writer.error).__name__,
                writer.error)
        raise
    _BEHIND.reset(token)
    if not writer.close(timeout):
        raise TimeoutError(f"client state files not written within {timeout} s: still writing "
                           f"{str(writer.writing)!r} (a stuck disk or network mount?)")
    if writer.error is not None:
        raise writer.error


def write_behind(path: Path, write: Callable[[], None]) -> bool:
    """Hand ``write`` of ``path`` to the thread of the :func:`saves_behind` block this context is in;
    ``False`` outside one, or after it ended (the caller then writes the file itself)."""
    writer = _BEHIND.get()
    return writer is not None and writer.take(path, write)


__all__ = ["saves_behind", "write_behind"]
