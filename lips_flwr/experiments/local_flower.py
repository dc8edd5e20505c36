"""Run Flower Apps with ``flwr run`` on a private local SuperLink, and clean up after.

``flwr run`` (Flower 1.42) starts a local SuperLink in the background that
outlives the run, keeps the environment and working directory of the first
call, and exits 0 even when the run fails. :func:`local_flower` gives a
handle with its own Flower home (``FLWR_HOME``) and free ports, so nothing of
the user's own Flower set-up is touched; on exit the SuperLink it started is
found by its command line (``--log-file <FLWR_HOME>/local-superlink/...``) and
stopped, with its descendants (SuperExec, simulation, Ray), by pid.

Process tooling, not part of the batched engine (:mod:`.batched`) or the
LIPS API: it starts and stops a private local SuperLink for ``flwr run``
from scripts and tests (the examples' runners, the integration tests), by
pid. Linux only (reads ``/proc``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, session id, start time) for all visible processes."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Field 2 (comm) may contain spaces: split after the closing paren.
        rest = stat[stat.rindex(")") + 2 :].split()
        table[int(entry)] = (int(rest[1]), int(rest[3]), rest[19])
    return table


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def find_superlinks(log_file: Path) -> list[int]:
    """Pids of `flower-superlink` processes writing to ``log_file``."""
    found = []
    for pid in _proc_table():
        argv = _cmdline(pid)
        if (
            any(Path(a).name == "flower-superlink" for a in argv[:2])
            and "--log-file" in argv
            and argv[argv.index("--log-file") + 1 :][:1] == [str(log_file)]
        ):
            found.append(pid)
    return found


def _tree(roots: list[int], leaders: frozenset[int] = frozenset()) -> dict[int, str]:
    """Roots, their descendants, and members of their sessions -> start time.

    ``leaders``: session ids whose members belong to the tree even when the
    leader has exited (its orphans keep its session id).
    """
    table = _proc_table()
    keep = {pid for pid in roots if pid in table}
    changed = True
    while changed:
        sessions = keep | leaders  # each of our processes may lead a session
        new = {
            pid
            for pid, (ppid, sid, _) in table.items()
            if pid not in keep and (ppid in keep or sid in sessions)
        }
        keep |= new
        changed = bool(new)
    keep.discard(os.getpid())
    return {pid: table[pid][2] for pid in keep}


def _signal_all(procs: dict[int, str], sig: int) -> None:
    table = _proc_table()
    for pid, start in procs.items():
        if pid in table and table[pid][2] == start:  # same process, not a reused pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an exited process its parent has not reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _alive(procs: dict[int, str]) -> dict[int, str]:
    table = _proc_table()
    return {pid: start for pid, start in procs.items()
            if pid in table and table[pid][2] == start and running(pid)}


def stop_superlink(log_file: Path, grace_s: float = 5.0) -> list[int]:
    """Terminate the SuperLink(s) writing to ``log_file`` and their process tree.

    SIGTERM to the SuperLink first (it shuts down its SuperExec and the
    simulation), then SIGTERM to whatever is left, then SIGKILL.
    """
    return stop_tree(find_superlinks(log_file), grace_s)


def stop_tree(roots: list[int], grace_s: float = 5.0) -> list[int]:
    """Terminate the processes ``roots`` and their trees; returns every pid found.

    The tree is each root's descendants and, for a root started in a session
    of its own (``start_new_session=True``), every member of that session,
    even one whose parent has exited. SIGTERM to the roots first (Flower's
    processes shut down their own children), then SIGTERM to whatever is
    left, then SIGKILL until none is left (at most ``grace_s`` more); a pid
    is only signalled while it still belongs to the process that was found
    (same start time).
    """
    procs = _tree(roots)
    leaders = frozenset(p for p in roots if p in procs)  # (alive now: their pids are their sessions' ids)
    for targets in ({p: procs[p] for p in roots if p in procs}, None):
        _signal_all(procs if targets is None else targets, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _alive(procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        procs.update(_tree(list(_alive(procs)), leaders))  # children spawned meanwhile
    # SIGKILL, until nothing of the tree is left: a killed process takes a moment to go (a large
    # one longer on a loaded machine), and an orphan its parent started before dying is found in
    # its session. The caller may then count on every process being gone.
    deadline = time.monotonic() + grace_s
    alive = _alive(procs)
    while alive and time.monotonic() < deadline:
        _signal_all(alive, signal.SIGKILL)
        time.sleep(0.05)
        procs.update(_tree(list(alive), leaders))
        alive = _alive(procs)
    return sorted(procs)


def find_processes(needle: str) -> list[int]:
    """Pids of live processes, other than this one, whose command line contains ``needle``."""
    table = _proc_table()
    return sorted(
        pid
        for pid, (_, _, start) in table.items()
        if pid != os.getpid()
        and any(needle in arg for arg in _cmdline(pid))
        and _alive({pid: start})
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalFlower:
    """Runs `flwr` CLI commands against a private local SuperLink.

    Use as a context manager: on exit the SuperLink that ``flwr run`` started
    (and its SuperExec, simulation and Ray processes) is stopped by pid.
    Build one with :func:`local_flower`.
    """

    home: Path
    env: dict[str, str]
    cwd: Path = field(default_factory=Path.cwd)
    stopped: list[int] = field(default_factory=list)  # pids ended by close()

    def __enter__(self) -> LocalFlower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the SuperLink of this Flower home and everything it started."""
        self.stopped = stop_superlink(self.log_file)
        if find_superlinks(self.log_file):
            raise RuntimeError(f"SuperLink of {self.home} still running")

    @property
    def log_file(self) -> Path:
        return self.home / "local-superlink" / "superlink.log"

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        exe = Path(sys.executable).with_name("flwr")
        cmd = [str(exe) if exe.exists() else "flwr", *args]
        return subprocess.run(
            cmd, env=self.env, cwd=self.cwd, capture_output=True, text=True,
            timeout=timeout, check=False,
        )

    def run(self, app: Path, run_config: str, federation_config: str) -> str:
        """`flwr run --format json`; returns the run id (the run goes on in the background)."""
        proc = self.cli(
            "run", str(app), "--format", "json",
            "--federation-config", federation_config,
            "--run-config", run_config,
        )
        try:
            out = json.loads(proc.stdout[proc.stdout.index("{") :])
        except ValueError:
            out = {}
        if proc.returncode != 0 or not out.get("success"):
            raise RuntimeError(f"flwr run {app} failed:\n{proc.stdout}{proc.stderr}")
        return str(out["run-id"])

    def status(self, run_id: str) -> str:
        proc = self.cli("ls", "--run-id", run_id, "--format", "json", timeout=60)
        try:
            out = json.loads(proc.stdout[proc.stdout.index("{") :])
        except ValueError:
            return "unknown"
        runs = out.get("runs") or []
        return runs[0]["status"] if runs else "unknown"

    def wait(
        self,
        run_id: str,
        timeout: float = 600.0,
        progress: Callable[[str], None] | None = None,
        progress_every: float = 10.0,
    ) -> str:
        """Poll `flwr ls` until the run is finished:*; returns that status.

        ``flwr run`` exits 0 even for runs that fail: check for
        ``"finished:completed"``. A run still going after ``timeout`` seconds is
        stopped and ``TimeoutError`` raised with the end of its log. Every
        ``progress_every`` seconds ``progress`` gets the status and the last
        ``[ROUND r/T]`` of the run's log.
        """
        deadline = time.monotonic() + timeout
        next_report = time.monotonic() + progress_every
        status = "unknown"
        while time.monotonic() < deadline:
            status = self.status(run_id)
            if status.startswith("finished"):
                return status
            if progress is not None and time.monotonic() >= next_report:
                rounds = re.findall(r"\[ROUND (\d+/\d+)\]", self.logs(run_id))
                progress(f"{status}, round {rounds[-1]}" if rounds else status)
                next_report = time.monotonic() + progress_every
            time.sleep(2)
        self.cli("stop", run_id, timeout=60)
        raise TimeoutError(f"run {run_id} not finished after {timeout:.0f}s (last: {status})"
                           f"\n{self.logs(run_id)[-4000:]}")

    def logs(self, run_id: str) -> str:
        proc = self.cli("log", run_id, "--show", timeout=60)
        return proc.stdout + proc.stderr

    def first_error(self, run_id: str) -> str | None:
        """The first exception in the run's log (see :func:`first_error`); ``None`` if none."""
        return first_error(self.logs(run_id))


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:\s?")
# The last line of a traceback: `[pkg.]NameError[(...)][: message]`.
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure))(?:\([\w.]*\))?(?::\s?(.*))?$"
)
# Flower's and Ray's wrappers around a ClientApp's own exception.
_WRAPPERS = {"ClientAppException", "RayTaskError", "RayActorError", "ServerAppException"}
_TRACE_LINE = re.compile(r"^(\s+|Traceback \(most recent call last\)|The above exception|During handling)")


def first_error(log_text: str, max_lines: int = 12) -> str | None:
    """The first exception in a run's log (``flwr log``), without Flower's and Ray's wrappers.

    The first ``ERROR`` block (or ``Traceback``) is searched for the last line
    of a traceback, ``SomeError: message`` (with the message's further lines),
    preceded by the ``File ...`` line where it was raised; ``None`` when the
    log shows no exception. A ClientApp that fails in every round fails
    the same way each time: its first error is what a user needs to see.
    """
    lines = [_ANSI.sub("", line).rstrip() for line in log_text.splitlines()]
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("ERROR") and _LOG_LINE.match(line)
                  or line.startswith("Traceback (most recent call last)")), None)
    if start is None:
        return None
    block = [_LOG_LINE.sub("", lines[start])]
    for line in lines[start + 1:]:
        level = _LOG_LINE.match(line)
        if level and level.group(1) != "ERROR":
            break
        block.append(_LOG_LINE.sub("", line) if level else line)
    found = [(i, m) for i, line in enumerate(block) if (m := _EXCEPTION_LINE.match(line))]
    if not found:
        return None
    own = [(i, m) for i, m in found if m.group(1) not in _WRAPPERS and (m.group(2) or "").strip()]
    index, _ = (own or found)[0]
    out = [block[index]]
    for line in block[index + 1:]:  # a message of several lines
        if not line or _TRACE_LINE.match(line) or _EXCEPTION_LINE.match(line) or len(out) >= max_lines:
            break
        out.append(line)
    frames = [i for i in range(index) if block[i].lstrip().startswith("File ")]
    if frames:
        where = [block[frames[-1]].strip()]
        if frames[-1] + 1 < index and block[frames[-1] + 1].startswith("    "):
            where.append("  " + block[frames[-1] + 1].strip())
        out = where + out
    return "\n".join(out)


def local_flower(home: Path, *, pythonpath: list[str] | None = None, cwd: Path | None = None) -> LocalFlower:
    """A :class:`LocalFlower` with its own Flower home, free ports and offline settings.

    ``pythonpath`` is prepended to ``PYTHONPATH`` of every process the
    SuperLink starts (e.g. a source checkout of ``lips_flwr``); the current
    interpreter's ``bin`` comes first on ``PATH``, so the SuperLink's
    SuperExec and simulation run in this environment.
    """
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(_free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(_free_port()),
        PYTHONPATH=os.pathsep.join(
            p for p in (*(pythonpath or []), os.environ.get("PYTHONPATH")) if p
        ),
        PYTHONUNBUFFERED="1",
    )
    # The simulation's Ray would run the ClientApps 15 steps nicer than this process, starved by any
    # busy one beside them; they are the run's work (runner.dispatch.start_local_ray says more).
    env.setdefault("RAY_worker_niceness", "0")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return LocalFlower(home=home, env=env, cwd=Path.cwd() if cwd is None else Path(cwd))


__all__ = [
    "LocalFlower", "find_processes", "find_superlinks", "first_error", "local_flower", "running",
    "stop_superlink", "stop_tree",
]
