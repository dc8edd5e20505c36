"""A batched run keeps the objects older than it out of the garbage collector's full collections."""

from __future__ import annotations

import gc
import weakref

import pytest
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from lips_flwr.experiments.batched import run_batched
from lips_flwr.experiments.batched.run import _older_objects_frozen


class Cycle:
    """An object in a reference cycle with itself: only a full collection frees it once dropped."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def nothing_frozen():
    assert gc.isenabled() and gc.get_freeze_count() == 0, "collector off or objects frozen before the test"
    yield
    assert gc.get_freeze_count() == 0, "the test left objects frozen"


def test_the_objects_alive_at_the_start_are_frozen_inside_and_collected_as_before_after():
    older = Cycle()
    with _older_objects_frozen():
        assert gc.get_freeze_count() > 0
        frozen = weakref.ref(older)
        del older
        gc.collect()
        assert frozen() is not None  # frozen: a full collection inside does not free it
        newer = weakref.ref(Cycle())
        gc.collect()
        assert newer() is None  # what the block makes is collected as ever
    gc.collect()
    assert frozen() is None  # unfrozen on exit: collected


def test_garbage_of_before_the_block_is_collected_first_not_kept_for_the_block():
    garbage = weakref.ref(Cycle())  # (unreachable already, not collected yet)
    assert garbage() is not None
    with _older_objects_frozen():
        assert garbage() is None


@pytest.mark.parametrize("error", [KeyError, KeyboardInterrupt])
def test_an_error_in_the_block_still_unfreezes(error):
    with pytest.raises(error), _older_objects_frozen():
        raise error("boom")
    assert gc.get_freeze_count() == 0


def test_nothing_is_done_where_the_collector_is_off_or_something_else_froze_objects():
    gc.disable()
    try:
        with _older_objects_frozen():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()
    # (By what is collected, not by gc.get_freeze_count(): frozen objects that die leave the count.)
    older = Cycle()
    caller_frozen = weakref.ref(older)
    gc.freeze()
    try:
        newer = Cycle()  # made after the caller's freeze: not frozen
        not_frozen = weakref.ref(newer)
        with _older_objects_frozen():
            del newer
            gc.collect()
            assert not_frozen() is None  # the block froze nothing more
        del older
        gc.collect()
        assert caller_frozen() is not None  # nor unfroze anything: that is the caller's to do
    finally:
        gc.unfreeze()
    gc.collect()
    assert caller_frozen() is None


@pytest.mark.parametrize("engine", ["sequential", "stacked"])
def test_a_batched_run_freezes_while_its_server_app_runs_and_unfreezes_after(engine):
    seen: list[tuple[str, int]] = []
    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        seen.append(("client", gc.get_freeze_count()))
        return Message(RecordDict({"metrics": MetricRecord({"x": 1})}), reply_to=msg)

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        seen.append(("server", gc.get_freeze_count()))
        replies = grid.send_and_receive([Message(RecordDict(), n, "train") for n in grid.get_node_ids()])
        assert all(not reply.has_error() for reply in replies)

    run_batched(server, client, run_config={}, num_nodes=2, engine=engine)
    assert [who for who, _ in seen] == ["server", "client", "client"]
    assert all(count > 0 for _, count in seen)
    assert gc.get_freeze_count() == 0


def test_a_run_inside_a_run_leaves_the_outer_runs_freeze_alone():
    inner_ran: list[int] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        inner = ServerApp()
        inner.main()(lambda grid, context: inner_ran.append(gc.get_freeze_count()))
        run_batched(inner, ClientApp(), run_config={}, num_nodes=1, engine="sequential")
        assert len(inner_ran) == 1 and inner_ran[0] > 0  # it ran, frozen
        assert gc.get_freeze_count() > 0  # and left the outer run's objects frozen

    run_batched(server, ClientApp(), run_config={}, num_nodes=1, engine="sequential")
    assert inner_ran and gc.get_freeze_count() == 0
