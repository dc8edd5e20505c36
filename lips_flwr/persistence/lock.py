"""One writer per checkpoint: an ``flock`` on ``<checkpoint>.lock``, held for a whole run.

Two runs writing the same checkpoint would overwrite each other's rounds, and
a resume would continue whichever saved last. A strategy therefore takes the
checkpoint's lock (:func:`lock_checkpoint`) at the start of its run and keeps
it to the last save. Between processes it is an ``flock``, which the OS frees
when its process dies, so a killed writer leaves no stale lock behind. Within
a process an ``flock`` does not tell runs apart, so :class:`CheckpointLock`
holders are also tracked here, per lock file: a new run of the same thread (or
of a thread that ended) takes the lock over from a crashed one.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import weakref
from pathlib import Path

if sys.platform == "win32":  # pragma: no cover - not what CI runs
    import msvcrt

    def _try_lock(fd: int) -> bool:
        """Lock ``fd``'s first byte (not waiting): ``False`` when another open file holds it."""
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
else:
    import errno
    import fcntl

    def _try_lock(fd: int) -> bool:
        """``flock`` ``fd`` (exclusive, not waiting): ``False`` when another open file holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True


_HOLDERS: dict[str, weakref.ref[CheckpointLock]] = {}  # lock file (real path) -> its holder here
_HOLDERS_GUARD = threading.RLock()


def _new_guard() -> None:
    """In a forked child: a fresh guard (one held by a thread that did not follow would never free)."""
    global _HOLDERS_GUARD
    _HOLDERS_GUARD = threading.RLock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_new_guard)


class CheckpointLock:
    """This process's right to write one checkpoint, taken by :func:`lock_checkpoint`.

    Held until :meth:`release`, until the object is garbage collected, or
    until the process ends (the OS frees an ``flock`` with its process, so a
    killed writer leaves no lock behind). ``lost`` says why it was taken away.
    """

    def __init__(self, path: str, lock_path: Path, key: str, fd: int | None, os_note: str | None) -> None:
        self.path, self.lock_path, self._key = path, lock_path, key
        self.os_note = os_note  # why the file could not be locked (a filesystem without locks)
        self.thread = threading.current_thread()
        self.lost: str | None = None
        self.taken_over = False  # by another run of this process: this one must not write
        self._fd = fd
        self._finalizer = weakref.finalize(self, _drop, key, fd)

    @property
    def held(self) -> bool:
        return self.lost is None and self._finalizer.alive

    def check(self) -> None:
        """``ValueError`` when another run took the checkpoint over."""
        if self.lost is not None:
            raise ValueError(self.lost)

    def release(self) -> None:
        """Let another run write the checkpoint."""
        with _HOLDERS_GUARD:
            self._finalizer()
            self.lost = self.lost or f"this run released the LIPS checkpoint {self.path!r}"

    def _hand_over(self, path: str) -> CheckpointLock:
        """The lock, for a new run of this thread (or of one that ended); this one can no longer write."""
        self._finalizer.detach()
        self.taken_over = True
        self.lost = (f"the LIPS checkpoint {self.path!r} was taken over by another run in this process "
                     f"(thread {threading.current_thread().name}): this run can no longer write it")
        successor = CheckpointLock(path, self.lock_path, self._key, self._fd, self.os_note)
        _HOLDERS[self._key] = weakref.ref(successor)
        return successor


def _drop(key: str, fd: int | None) -> None:
    with _HOLDERS_GUARD:
        ref = _HOLDERS.get(key)
        holder = None if ref is None else ref()
        if ref is not None and (holder is None or holder._fd == fd):
            del _HOLDERS[key]
    if fd is not None:
        os.close(fd)  # frees the flock


def lock_checkpoint(path: str | os.PathLike) -> CheckpointLock:
    """Take the right to write the checkpoint ``path``: an ``flock`` on ``<path>.lock``.

    Refused (``ValueError``, not waiting) while another process holds it, or
    another thread of this process whose run may still be going. A run of the
    same thread, or of a thread that ended, is over (crashed: its strategy may
    outlive it in a traceback): the new run takes the lock over, and the old
    one's next save is refused.
    """
    path = os.fspath(path)
    lock_path = Path(path + ".lock")
    key = os.path.realpath(lock_path)
    busy = (f"the LIPS checkpoint {path!r} is in use: another run is writing it (%s); two runs cannot "
            "share a checkpoint: give this run another `checkpoint_path`, or stop the other run")
    for attempt in range(2):
        with _HOLDERS_GUARD:
            ref = _HOLDERS.get(key)
            holder = None if ref is None else ref()
            if holder is not None and holder.held:
                if holder.thread is threading.current_thread() or not holder.thread.is_alive():
                    return holder._hand_over(path)
                if attempt:
                    raise ValueError(busy % f"a strategy of this process, thread {holder.thread.name}")
            else:
                return _lock_file(path, lock_path, key, busy)
        # A crashed run's strategy in a reference cycle: collect it, then look again (without a reference
        # of ours to its lock, which would keep the lock alive through the collection).
        holder = None
        _collect_frozen_too()
    raise AssertionError("unreachable")


def _collect_frozen_too() -> None:
    """``gc.collect()`` of the objects ``gc.freeze()`` keeps out of collections too, frozen again after.

    Something may have frozen the objects the process held (a batched run does while it runs): a
    crashed run's strategy among them, garbage since, would otherwise stay, and hold its lock. (The
    freeze after takes in the objects made since too, until whatever froze them unfreezes: they
    are only left out of collections meanwhile.)
    """
    frozen = gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    try:
        gc.collect()
    finally:
        if frozen:
            gc.freeze()


def _lock_file(path: str, lock_path: Path, key: str, busy: str) -> CheckpointLock:
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise ValueError(f"cannot write the LIPS checkpoint {path!r}: {err}") from err
    note = None
    try:
        locked = _try_lock(fd)
    except OSError as err:  # a filesystem without locks: one writer per process only
        locked, note = True, f"cannot lock {str(lock_path)!r} ({err})"
    if not locked:
        os.close(fd)
        raise ValueError(busy % f"another process holds {str(lock_path)!r}")
    holder = CheckpointLock(path, lock_path, key, fd, note)
    _HOLDERS[key] = weakref.ref(holder)
    return holder


__all__ = ["CheckpointLock", "lock_checkpoint"]
