"""The batched simulation engine: a Flower ``Grid`` that runs a round's clients in this process.

:mod:`.grid` (:class:`BatchedGrid`, :func:`run_batched`: the ServerApp's own
code on a Grid whose nodes are ClientApp calls in this process),
:mod:`.rendezvous` (a round's client threads meet at their training call) and
:mod:`.stacked` (those calls run at once, the clients' models stacked with
``torch.func``).
"""

from .grid import ENGINES, BatchedGrid, GridObserver, run_batched

__all__ = ["BatchedGrid", "ENGINES", "GridObserver", "run_batched"]
