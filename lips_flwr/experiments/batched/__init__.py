"""The batched simulation engine: a Flower ``Grid`` that runs a round's clients in this process.

:mod:`.grid` (:class:`BatchedGrid`: a Grid whose nodes are ClientApp calls
in this process), :mod:`.run` (:func:`run_batched`: the ServerApp's own code
on one),
:mod:`.calls` (a ClientApp call: its reply or Flower's error reply, with a
deadline), :mod:`.rendezvous` (a round's client threads meet at their
training call), :mod:`.workers` (those threads, kept from one delivery to
the next), :mod:`.chunks` (a chunk of the gathered calls run, together or
one by one), :mod:`.stacked` (calls run at once, the clients' models
stacked with ``torch.func``) and :mod:`.signature` (which models may
be stacked together).
"""

from .grid import ENGINES, BatchedGrid, GridObserver
from .run import run_batched

__all__ = ["BatchedGrid", "ENGINES", "GridObserver", "run_batched"]
