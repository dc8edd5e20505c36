"""The batched simulation engine: a Flower ``Grid`` that runs a round's clients in this process.

:mod:`.grid` (:class:`BatchedGrid`, :func:`run_batched`: the ServerApp's own
code on a Grid whose nodes are ClientApp calls in this process),
:mod:`.calls` (a ClientApp call: its reply or Flower's error reply, with a
deadline), :mod:`.rendezvous` (a round's client threads meet at their
training call), :mod:`.stacked` (those calls run at once, the clients'
models stacked with ``torch.func``) and :mod:`.signature` (which models may
be stacked together).
"""

from .grid import ENGINES, BatchedGrid, GridObserver, run_batched

__all__ = ["BatchedGrid", "ENGINES", "GridObserver", "run_batched"]
