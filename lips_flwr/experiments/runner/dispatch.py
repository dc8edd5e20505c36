"""A sweep's batched runs on Ray: each run a task in a fresh worker process, a seed's runs on one node.

:func:`ray_session` joins the Ray cluster at ``address`` (``"auto"``,
``HOST:PORT``, ``ray://HOST:10001``; else ``RAY_ADDRESS``), or the Ray this
process has joined already, or starts a local Ray sized to the machine
without the dashboard, says in one line how long that took, and shuts it
down at the end. :func:`~.sweep.run_tasks` then runs the jobs there (:class:`RayRuns`):

- **resources**: each run is a task of :class:`Plan`'s ``slot`` CPUs and
  ``gpus_per_run`` GPUs (fractions allowed), in a worker process of its own
  (:mod:`.worker`); Ray starts as many at once as the cluster holds.
- **pairs**: the runs of one seed (the arms a paired test compares) share a
  placement group packed on one node (``STRICT_PACK``), ``min(runs, jobs)``
  slots wide: both arms of a seed compute in one numerical environment.
  A seed's group is removed when its runs end, freeing its node for the
  next seed.
- **progress** comes from the tasks through a mailbox actor (rounds, a
  heartbeat as client calls end, notes), picked up as they come.
- **faults**: a run whose node is lost (``NodeDiedError``) runs again, up to
  :data:`~.sweep.NODE_RETRIES` times, on a node Ray places its seed's group on
  again; its staging folder is claimed again first, so it continues where
  the output folder is on storage every node sees, and starts at round 1
  elsewhere (one line says which). No other failure is retried
  (:func:`~.sweep.run_tasks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import NodeDiedError, RayError, TaskCancelledError, WorkerCrashedError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from .board import Progress
from .runs import PreparedRun
from .slots import available_cores, default_jobs
from .worker import Place, run_task

POLL_S = 0.1  # seconds the sweep waits for a task's event before it looks at placed groups and ended tasks


@contextlib.contextmanager
def ray_session(address: str | None, progress: Progress) -> Iterator[None]:
    """Ray for a sweep (see the module docstring): joined or started here, shut down if started here."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if ray.is_initialized():
        progress(f"using the Ray this process has joined ({_cpus()} CPUs)")
        yield
        return
    start = time.monotonic()
    if address:
        _check_reachable(address)
        try:
            with _quiet():
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except (ConnectionError, RuntimeError) as err:
            raise ValueError(f"cannot join the Ray cluster at {address!r}: {err}") from err
        progress(f"joined the Ray cluster at {address!r} in {time.monotonic() - start:.1f} s "
                 f"({len(_nodes())} node(s), {_cpus()} CPUs)")
    else:
        start_local_ray()
        progress(f"Ray started in {time.monotonic() - start:.1f} s (local, {_cpus()} CPUs)")
    try:
        yield
    finally:
        ray.shutdown()


# glibc's malloc in the local Ray's processes, the runs' among them (read as a process starts). By default
# it gives freed blocks above a threshold (128 KB, rising to 32 MB at most) back to the OS, and each thread
# but the main one allocates from arenas whose empty heaps go back too: each round's new replies (a
# ResNet8's: 4.9 MB of bytes), the stacked engine's client threads' copies and torch's CPU tensors were
# faulted in again page by page (a 4.9 MB reply in a thread: ~600 faults, 1.7 ms on the development VM,
# against 0.2 ms from memory kept). One arena, and blocks up to 64 MB kept (32 MB before glibc 2.35, which
# ignores more while the trim threshold still turns the sliding one off, pinning it at 128 KB): a run's
# process holds its peak memory until it ends (each run has its own).
MALLOC_SETTINGS = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(64 << 20),
                   "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}
OLD_GLIBC_MMAP_THRESHOLD = str(32 << 20)  # the most glibc < 2.35 takes (HEAP_MAX_SIZE / 2 on 64 bits)


def start_local_ray() -> None:
    """Start a local Ray for this process: sized to the machine, no dashboard, runs at the sweep's priority.

    Ray starts its workers 15 steps nicer than the driver by default, so that
    its own processes stay responsive. A sweep's runs are the work itself:
    beside four busy processes on 2 cores they got about 3% of a core each and
    stalled for 300 s. ``worker_niceness = 0`` gives them the sweep's own
    niceness instead (``nice lips-flwr compare ...`` still makes them nicer).
    Its processes start with :data:`MALLOC_SETTINGS`, unless this process's
    environment sets one of those variables (then it keeps to its own).
    """
    with _quiet(), _environment(malloc_settings()):
        ray.init(address="local", num_cpus=available_cores(), include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR, _system_config={"worker_niceness": 0})


def malloc_settings() -> dict[str, str]:
    """:data:`MALLOC_SETTINGS` (the mmap threshold at 32 MB for glibc < 2.35), or none where this
    process's environment sets any of them, or any of glibc's malloc tunables
    (``GLIBC_TUNABLES=glibc.malloc...``): the user's choice stands."""
    users = any(name in os.environ for name in MALLOC_SETTINGS)
    if users or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return {}
    settings = dict(MALLOC_SETTINGS)
    if glibc_version() < (2, 35):
        settings["MALLOC_MMAP_THRESHOLD_"] = OLD_GLIBC_MMAP_THRESHOLD
    return settings


def glibc_version() -> tuple[int, ...]:
    """This process's glibc version, e.g. ``(2, 36)``; ``(0,)`` where there is none to name (another C
    library, or another OS: the variables are then read by nothing)."""
    try:
        name, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
        return tuple(int(part) for part in version.split(".")[:2]) if name == "glibc" else (0,)
    except (ValueError, OSError):
        return (0,)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block (what Ray's processes started in it inherit), then
    what was there before."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without Ray 2.55's FutureWarning on accelerator variables: a run that reserves no GPU sees none."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
        yield


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """``ValueError`` when ``HOST:PORT`` (or ``ray://HOST:PORT``) takes no connection within ``timeout`` s.

    Ray itself waits minutes on an address where nothing listens; ``auto``
    is Ray's to resolve (it fails at once when no cluster runs here).
    """
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        if address != "auto":
            raise ValueError(f"a Ray address is auto, HOST:PORT or ray://HOST:10001, got {address!r}")
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise ValueError(f"cannot reach the Ray cluster at {address!r}: {err} (is `ray start --head` "
                         f"running there, and is the port open?)") from err


def _nodes() -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive")]


def _cpus() -> int:
    return int(ray.cluster_resources().get("CPU", 0))


@ray.remote(num_cpus=0)
class _Mailbox:
    """Where the tasks drop their progress events and the sweep's process picks them up as they come."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple]] = []
        self.arrived = asyncio.Event()

    async def tell(self, name: str, event: tuple) -> None:
        self.events.append((name, event))
        self.arrived.set()

    async def take(self, wait: float) -> list[tuple[str, tuple]]:
        """The events so far, waiting at most ``wait`` seconds for the first (a round ends, a run ends)."""
        if not self.events:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), wait)
        self.arrived.clear()
        events, self.events = self.events, []
        return events


@ray.remote(max_calls=1, max_retries=0)
def _task(job: PreparedRun, resuming: bool, place: Place, mailbox: Any) -> tuple:
    """One run, in a fresh worker process (:func:`~.worker.run_task`)."""
    node = {"hostname": socket.gethostname(), "ray_node_id": ray.get_runtime_context().get_node_id()}
    try:
        return run_task(job, resuming, place, lambda event: mailbox.tell.remote(job.name, event), node)
    finally:
        mailbox.tell.remote(job.name, ("ended",))  # (wakes the sweep's process: a task has ended)


@dataclass
class _Seat:
    """One slot of a seed's placement group: its runs, one after another."""

    group: PlacementGroup
    index: int
    queue: list[PreparedRun]
    busy: bool = False


@dataclass
class Outcome:
    """How a run's task ended, for the sweep: ``kind`` done, failed, stopped, crashed, lost or cancelled."""

    kind: str
    event: tuple = ()
    error: str = ""


@dataclass
class Plan:
    """The slots of a sweep on this cluster: ``slot`` CPUs a run, ``threads`` each, a seed's runs at once.

    ``slot`` is ``cores // parallel`` (at most a node's CPUs); where more
    runs at once are asked for than there are cores (``--jobs 3`` on 2
    cores), it is the fraction ``cores / parallel``, so that Ray starts them
    all, each with one thread, as the pool of processes did.
    """

    parallel: int
    slot: float
    gpus: float
    groups: list[list[list[PreparedRun]]] = field(default_factory=list)  # seed -> seat -> runs

    @classmethod
    def make(cls, jobs: list[PreparedRun], parallel: int | None, gpus: float) -> Plan:
        cores = max(1, _cpus())
        widest = max([int(n["Resources"].get("CPU", 0)) for n in _nodes()] + [1])
        parallel = min(parallel or default_jobs(len(jobs), cores), len(jobs))
        # (Ray counts resources to 1e-4: the fraction rounded down, so that `parallel` of them fit)
        slot = float(max(1, min(cores // parallel, widest))) if parallel <= cores else (
            math.floor(cores / parallel * 1e4) / 1e4)
        seeds: dict[int, list[PreparedRun]] = {}
        for job in jobs:
            seeds.setdefault(job.spec.seed, []).append(job)
        plan = cls(parallel, slot, gpus)
        for runs in seeds.values():
            width = max(1, min(len(runs), parallel, int(widest / slot)))
            plan.groups.append([runs[i::width] for i in range(width)])
        return plan

    @property
    def threads(self) -> int:
        return max(1, int(self.slot))

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.slot, **({"GPU": self.gpus} if self.gpus else {})}


class RayRuns:
    """The tasks of one sweep on Ray, started seat by seat, their outcomes collected (``sweep.run_tasks``)."""

    def __init__(self, plan: Plan, place: Callable[[PreparedRun], Place],
                 claim: Callable[[PreparedRun], bool]) -> None:
        self.plan, self.place, self.claim = plan, place, claim
        head = {"node:__internal_head__": 0.001}  # (pinned to the head: it dies with the cluster, not a node)
        self.mailbox = _Mailbox.options(resources=head).remote()  # type: ignore[attr-defined]
        self.waiting: dict[Any, list[_Seat]] = {}  # a group's ready ref -> its seats
        self.running: dict[Any, tuple[PreparedRun, _Seat]] = {}
        self.lost: dict[str, int] = {}
        self.seats: dict[Any, list[_Seat]] = {}  # a group's id -> its seats
        self.cancelled: set[str] = set()
        for runs in plan.groups:
            group = placement_group([plan.bundle()] * len(runs), strategy="STRICT_PACK")
            seats = [_Seat(group, i, list(seat)) for i, seat in enumerate(runs)]
            self.waiting[group.ready()] = self.seats[group.id] = seats

    def start(self, seat: _Seat, job: PreparedRun | None = None) -> PreparedRun | None:
        """Start ``job`` (else the seat's next run) in ``seat``; the run started, ``None`` if none is left."""
        if job is None:
            if not seat.queue:
                return None  # (the caller frees the seat: :meth:`free`)
            job = seat.queue.pop(0)
        resuming = self.claim(job)
        strategy = PlacementGroupSchedulingStrategy(seat.group, placement_group_bundle_index=seat.index)
        ref = _task.options(num_cpus=self.plan.slot, num_gpus=self.plan.gpus, scheduling_strategy=strategy,
                            name=f"lips-flwr run {job.name}", **_runtime_env(job)).remote(
            job, resuming, self.place(job), self.mailbox)
        self.running[ref] = (job, seat)
        seat.busy = True
        return job

    def events(self) -> list[tuple[str, tuple]]:
        """The tasks' events since the last call, waiting at most :data:`POLL_S` for one."""
        return list(ray.get(self.mailbox.take.remote(POLL_S)))

    def ended(self) -> list[Any]:
        """The refs of the tasks that ended and of the groups placed (not waiting)."""
        refs = [*self.waiting, *self.running]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return ready

    def outcome(self, ref: Any) -> tuple[PreparedRun, _Seat, Outcome]:
        job, seat = self.running.pop(ref)
        try:
            event = ray.get(ref)
        except (TaskCancelledError, WorkerCrashedError) as err:
            if job.name in self.cancelled:
                return job, seat, Outcome("cancelled")
            return job, seat, Outcome("crashed", error=f"{type(err).__name__}: its worker process died: a "
                                      "crash, an exit without a word, a signal or the OOM killer")
        except NodeDiedError as err:
            self.lost[job.name] = self.lost.get(job.name, 0) + 1
            return job, seat, Outcome("lost", error=str(err).splitlines()[0])
        except RayError as err:
            return job, seat, Outcome("crashed", error=f"{type(err).__name__}: {err}")
        return job, seat, Outcome(str(event[0]), event)

    def cancel(self, names: set[str] | None = None) -> list[str]:
        """Cancel (kill) the running tasks (those of ``names``); the names cancelled."""
        done = []
        for ref, (job, _seat) in list(self.running.items()):
            if names is None or job.name in names:
                self.cancelled.add(job.name)
                with contextlib.suppress(RayError, ValueError):
                    ray.cancel(ref, force=True)
                done.append(job.name)
        return done

    def settle(self, timeout: float = 30.0) -> None:
        """Wait (at most ``timeout`` s) for the cancelled tasks' processes to end; remove every group."""
        if self.running:
            ray.wait(list(self.running), num_returns=len(self.running), timeout=timeout, fetch_local=False)
        for group in {seats[0].group for seats in self.seats.values()}:
            with contextlib.suppress(RayError, ValueError):
                remove_placement_group(group)

    def free(self, seat: _Seat) -> None:
        """``seat`` has no run left: remove its group once none of the group's seats has one."""
        seat.busy = False
        if not any(other.busy or other.queue for other in self.seats[seat.group.id]):
            with contextlib.suppress(RayError, ValueError):
                remove_placement_group(seat.group)


def _runtime_env(job: PreparedRun) -> dict[str, Any]:
    """The task's ``runtime_env`` option: the spec's own ``env``, set before its worker process starts.

    Without one, none: Ray starts a task's worker with ``OMP_NUM_THREADS`` at
    its CPUs (or the sweep's caller's value), which numpy reads as it loads,
    and a runtime environment of its own costs each run a worker start
    (about 1 s on the 2-core development machine).
    """
    return {"runtime_env": {"env_vars": dict(job.spec.env)}} if job.spec.env else {}


__all__ = ["MALLOC_SETTINGS", "OLD_GLIBC_MMAP_THRESHOLD", "Outcome", "Plan", "RayRuns", "glibc_version",
           "malloc_settings", "ray_session", "start_local_ray"]
