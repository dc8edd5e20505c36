"""A Flower App run in this process: its ServerApp on a :class:`~.grid.BatchedGrid` of its ClientApp."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

import torch
from flwr.app import Context, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from lips_flwr.experiments.batched.grid import BatchedGrid, GridObserver
from lips_flwr.experiments.seeding import derive_seed, seed_globals


def run_batched(
    server_app: ServerApp,
    client_app: ClientApp,
    *,
    run_config: dict,
    num_nodes: int,
    engine: str = "auto",
    chunk_size: int | None = None,
    autocast: torch.dtype | None = None,
    run_id: int = 1,
    observer: GridObserver | None = None,
    seed: int | None = None,
    on_call: Callable[[], None] | None = None,
    on_grid: Callable[[BatchedGrid], None] | None = None,
) -> BatchedGrid:
    """Run a Flower App in this process: ``server_app`` on a :class:`BatchedGrid` of ``client_app``.

    ``run_config`` is the complete run config (the app's defaults with any
    overrides), as both sides see it under ``flwr run``. Returns the grid
    (its nodes' contexts, the time spent in clients). An exception of the
    ServerApp propagates; a ClientApp's becomes its error reply, as in Flower.

    ``observer``, ``seed`` and ``on_call``: see :class:`BatchedGrid`; with ``seed``, the
    process-wide generators are also seeded from ``derive_seed(seed, 0)``
    right before the ServerApp is called. ``on_grid(grid)`` is called with the
    grid before the ServerApp starts (the runner keeps the nodes' contexts).

    While the ServerApp runs, the objects the process held before it are out
    of the garbage collector's full collections (:func:`_older_objects_frozen`),
    and the stacked engine's client threads serve every delivery
    (:meth:`BatchedGrid.client_threads_kept`).
    """
    grid = BatchedGrid(client_app, num_nodes=num_nodes, run_config=run_config, engine=engine,
                       chunk_size=chunk_size, autocast=autocast, run_id=run_id, observer=observer,
                       seed=seed, on_call=on_call)
    if on_grid is not None:
        on_grid(grid)
    context = Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(),
                      run_config=dict(run_config))
    with _task_identity(run_id), _older_objects_frozen(), grid.client_threads_kept():
        if seed is not None:
            seed_globals(derive_seed(seed, 0))
        server_app(grid, context)
    return grid


@contextlib.contextmanager
def _older_objects_frozen() -> Iterator[None]:
    """Within the block, the tracked objects that survive one full collection at its start are left
    out of every collection (``gc.freeze()``); on exit they are collected as before (``gc.unfreeze()``).

    A run's calls make and drop many objects, which set off full collections now and then; each
    walks every tracked object of the process, and torch, Flower and the app hold hundreds of
    thousands before the first round (benchmarks/README.md section 8: ~350,000, 100-200 ms a
    collection on the development machine). Frozen, a full collection walks only the objects the
    run made. The price: the one collection at the start, and cycles of objects older than the run
    that become garbage during it are freed only after it. Nothing is done where the collector is
    off or objects are frozen already: unfreezing those is left to whatever froze them. (On exit,
    ``gc.unfreeze()`` also unfreezes what the run itself froze, and with two runs in threads at once
    the other run goes on unfrozen: slower, never wrong.)
    """
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.collect()  # (what is garbage now, a crashed run's strategy in a cycle, is not kept for the run)
    try:
        gc.freeze()  # (in the try: a Ctrl-C right after it still unfreezes)
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _task_identity(run_id: int) -> Iterator[None]:
    """The ServerApp's identity, which Flower's ``Message`` reads (flwr >= 1.40; older: nothing)."""
    try:
        from flwr.supercore.task_identity import TaskIdentity
    except ImportError:
        yield
        return
    saved = TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = run_id, run_id, 0
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


__all__ = ["run_batched"]
