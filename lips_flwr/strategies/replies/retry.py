"""The wrapped strategy's aggregation of the admitted replies, checked, and its retry without culprits.

One pass on a good round: the aggregate and the chain's declared state
(:func:`..chain.declared_state`: FedAdam's moments, FedAvgM's momentum, ...)
are each tested for NaN/Inf with one dot product per array
(:func:`lips_flwr.core.checks.nonfinite_arrays`); a chain that keeps no state
costs nothing more. When either is not finite, the replies are read to find
why: a reply with NaN/Inf, or with values that overflow the sum or their
square (:func:`.checks.culprit_among`), is dropped, the chain's state is put
back as it was before the aggregation, and the rest are aggregated again.
When no single reply explains it, the search goes on to the smallest set of
replies, the largest values first, whose removal makes both finite (at most
half of them); only then is the round given up, keeping the previous global
model. State that was already not finite before the round is not blamed on
its replies.

When the wrapped strategy raises, the replies it cannot read (another
serialization than numpy's) are dropped and the rest aggregated again; when
there are none, its exception propagates. A chain with a privacy accountant
is checked reply by reply before it aggregates: a retry would compose its
privacy release twice.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, MutableMapping
from logging import ERROR, WARNING
from typing import TYPE_CHECKING, Any, NamedTuple

from flwr.common import log

from ...core.checks import nonfinite_arrays
from ..chain import declared_state, inner_name
from .checks import culprit_among, ranked_by_reach

if TYPE_CHECKING:  # the gate imports this module
    from .gate import Model, ReplyAccess, ReplyGate


class Aggregated(NamedTuple):
    """The wrapped strategy's aggregate as the gate let it through (all ``None``: none)."""

    aggregate: Any
    metrics: Any
    views: Model | None  # read-only, in the global model's order, finite


NOTHING = Aggregated(None, None, None)


def nonfinite_state(chain: list, to_state: Callable[[Any], Any]) -> list[str]:
    """``Class.attribute`` of each declared state of the chain that holds NaN or Inf.

    Numbers are tested as they are; model-shaped values through ``to_state``
    (a codec's :meth:`~..codecs.ModelCodec.to_arrays`: an ArrayRecord, Parameters,
    a dict or list of arrays); anything else (a privacy accountant) is not looked at.
    """
    found = []
    for inner in chain:
        for attribute in declared_state(inner)[0]:
            value = getattr(inner, attribute, None)
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                bad = not math.isfinite(float(value))
            else:
                arrays = to_state(value)
                bad = arrays is not None and bool(nonfinite_arrays(arrays[1]))
            if bad:
                found.append(f"{type(inner).__name__}.{attribute}")
    return found


class Retry:
    """One round's aggregation by the wrapped chain, checked, and its re-runs from the chain's state
    before it (:meth:`aggregate`)."""

    def __init__(self, gate: ReplyGate, access: ReplyAccess, chain: list, server_round: int,
                 previous: Any) -> None:
        self.gate, self.access, self.chain, self.previous = gate, access, chain, previous
        self.round = server_round
        self.inner = inner_name(chain)
        self.saved = chain_state(chain)
        self.before: set[str] | None = None  # the state not finite before the round, once read
        # A privacy accountant: replies are checked one by one before the aggregation, never retried.
        self.irreversible = any(getattr(strategy, "accountant", None) is not None for strategy in chain)

    def aggregate(self, replies: list) -> Aggregated:
        """:meth:`.gate.ReplyGate.aggregate`: the chain's aggregate, finite with its state, or nothing."""
        replies = list(replies)
        self.access.snapshot(replies)
        if self.irreversible:
            while (found := self._culprit(replies)) is not None and found[1].startswith("NaN or Inf"):
                self.gate.drop(self.access, replies.pop(found[0]), found[1])
            self._drop_all(replies, self._unreadable(replies))
        try:
            outcome = self.run(replies, again=False)
        except Exception as err:
            bad = [] if self.irreversible else self._unreadable(replies)
            if not bad:
                raise
            log(WARNING, "LIPS: round %d: %s raised %s: %s; dropping the %d replies it cannot read and "
                "aggregating the rest again", self.round, self.inner, type(err).__name__, err, len(bad))
            self._drop_all(replies, bad)
            outcome = self.run(replies)
        while any(problems := self.problems(outcome)):
            if problems[1] and self.before is None and not self.irreversible and self.learn_before():
                outcome = self.run(replies)  # with the state it had: what was not finite is not the replies'
                continue
            restore_chain_state(self.saved)
            found = None if self.irreversible else self._culprit(replies)
            if found is not None:
                self.gate.drop(self.access, replies.pop(found[0]), found[1])
            else:
                left_out = None if self.irreversible else self.smallest_set(replies)
                if left_out is None:
                    self._give_up(problems, len(replies))
                    return NOTHING  # nor the metrics of that aggregate
                reason = (f"{self.inner} has NaN or Inf in {(problems[0] + problems[1])[:5]} with it: "
                          f"leaving out the {len(left_out)} of {len(replies)} replies with the largest "
                          "values makes it finite")
                self._drop_all(replies, [(i, reason) for i in left_out])
            outcome = self.run(replies)
        return outcome

    def run(self, replies: list, again: bool = True) -> Aggregated:
        """The chain's aggregate of ``replies`` (``again``: from its state and the replies as they were)."""
        if again:
            restore_chain_state(self.saved)
            self.access.restore()
        aggregate, metrics = self.access.aggregate(replies)
        views = None if aggregate is None else self.gate.aggregate_views(aggregate, self.previous)
        return Aggregated(aggregate, metrics, views)

    def problems(self, outcome: Aggregated) -> tuple[list[str], list[str]]:
        """What is not finite after ``outcome``: its arrays, and the chain's state that was finite before."""
        if outcome.views is None:
            return [], []
        state = nonfinite_state(self.chain, self.gate.codec.to_arrays)
        return nonfinite_arrays(outcome.views), [s for s in state if s not in (self.before or ())]

    def learn_before(self) -> bool:
        """Read which state was not finite before the round (the chain's state is put back for it);
        ``True`` when some was: the round must be aggregated again without blaming it on a reply."""
        restore_chain_state(self.saved)
        self.before = set(nonfinite_state(self.chain, self.gate.codec.to_arrays))
        if self.before:
            log(WARNING, "LIPS: the state of %s held NaN or Inf before this round (%s): no reply can be "
                "blamed for it", self.inner, sorted(self.before))
        return bool(self.before)

    def smallest_set(self, replies: list) -> list[int] | None:
        """Indices of the fewest replies, the largest values first, whose removal leaves nothing
        non-finite; ``None`` when leaving out half of them does not.

        Doubling, then bisecting, the count left out: a handful of aggregations.
        """
        limit = len(replies) // 2
        if limit < 1:
            return None
        self.access.restore()
        order = ranked_by_reach([self.access.views(r) for r in replies],
                                [self.access.overflow_weight(r) for r in replies])

        def sound(count: int) -> bool:
            left_out = set(order[:count])
            return not any(self.problems(self.run([r for i, r in enumerate(replies) if i not in left_out])))

        low, high = 0, None  # left out: `low` replies are too few, `high` enough
        while high is None and low < limit:
            count = min(2 * low or 1, limit)
            low, high = (low, count) if sound(count) else (count, None)
        if high is None:
            return None
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if sound(middle) else (middle, high)
        return order[:high]

    def _give_up(self, problems: tuple[list[str], list[str]], count: int) -> None:
        restore_chain_state(self.saved)
        why = ("a retry would compose its privacy release twice" if self.irreversible
               else "no reply explains it")
        what = f"the aggregate of {self.inner}" + (" or its state" if problems[1] else "")
        log(ERROR, "LIPS: round %d: %s has NaN or Inf in %s and %s; it is not broadcast, the global model "
            "stays as it was%s", self.round, what, (problems[0] + problems[1])[:5], why,
            "" if self.irreversible or count < 2 else
            f" (nor does leaving out up to {count // 2} of the {count} replies, the largest values first)")

    def _culprit(self, replies: list) -> tuple[int, str] | None:
        """``(index, reason)`` of the reply that makes an aggregate non-finite (reads every array)."""
        self.access.restore()
        return culprit_among([self.access.views(reply) for reply in replies],
                             [self.access.overflow_weight(reply) for reply in replies])

    def _unreadable(self, replies: list) -> list[tuple[int, str]]:
        """``(index, reason)`` of each reply with an array in another serialization than numpy's."""
        self.access.restore()
        found = enumerate(map(self.access.stype_problem, replies))
        return [(i, reason) for i, reason in found if reason is not None]

    def _drop_all(self, replies: list, found: list[tuple[int, str]]) -> None:
        for index, reason in sorted(found, reverse=True):
            self.gate.drop(self.access, replies.pop(index), reason)


# A retry must undo whatever the wrapped chain did while it aggregated, its own bookkeeping
# included (a DP wrapper pops its pending privacy event; a user's strategy counts rounds), not
# only the state a checkpoint declares (resume/chain_state.py): so this snapshot stays generic.
# Flower's strategies rebind what they keep (``self.current_arrays = ...``) or edit a container
# they hold (a dict, a list, an ArrayRecord: QFedAvg empties its ``current_arrays`` in place), so
# references and containers copied one level deep undo an aggregation; no array data is copied.
def chain_state(chain: list) -> list[tuple[Any, dict, dict]]:
    """Each strategy of the chain with a copy of its attributes, containers one level deep."""
    return [(inner, dict(vars(inner)), {k: _contents(v) for k, v in vars(inner).items()
                                        if isinstance(v, (MutableMapping, list, set))})
            for inner in chain]


def _contents(container: Any) -> Any:
    return list(container) if isinstance(container, list) else (
        set(container) if isinstance(container, set) else dict(container.items()))


def restore_chain_state(state: list[tuple[Any, dict, dict]]) -> None:
    """Put each strategy's attributes back as :func:`chain_state` found them."""
    for inner, attributes, containers in state:
        vars(inner).clear()
        vars(inner).update(attributes)
        for name, saved in containers.items():
            live = attributes[name]
            live.clear()
            live.extend(saved) if isinstance(live, list) else live.update(saved)


__all__ = ["Aggregated", "Retry", "chain_state", "nonfinite_state", "restore_chain_state"]
