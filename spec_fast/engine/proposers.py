"""The one map from a strategy to its proposer (:mod:`spec_fast.drafts.proposer`).

A :class:`~spec_fast.drafts.dual.DualDrafter` is drafted by the dual proposer whatever the shape it drafts per
head; every other drafter by the proposer of ``strategy.shape``. A new strategy is one proposer module and
one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spec_fast.drafts.chain import ChainProposer
from spec_fast.drafts.delayed import DelayedProposer
from spec_fast.drafts.dual import DualDrafter
from spec_fast.drafts.dual_drafting import DualProposer
from spec_fast.drafts.dynatree import DynaTreeProposer
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.proposer import PlainProposer, Proposer
from spec_fast.drafts.topk import TopKProposer
from spec_fast.nde.proposer import NdeProposer, NdeSelector
from spec_fast.strategies import SAMPLING_VERIFIERS, Strategy

__all__ = ["PROPOSERS", "make_proposer"]

#: ``(strategy, target, drafter, selector) -> proposer``
ProposerFactory = Callable[[Strategy, Any, Drafter | None, NdeSelector | None], Proposer]

#: strategy shape -> its proposer
PROPOSERS: dict[str, ProposerFactory] = {
    "ar": lambda strategy, target, drafter, selector: PlainProposer(strategy),
    "chain": lambda strategy, target, drafter, selector: ChainProposer(strategy, drafter),
    "iid": lambda strategy, target, drafter, selector: DelayedProposer(strategy, drafter),
    "delayed": lambda strategy, target, drafter, selector: DelayedProposer(strategy, drafter),
    "topk": lambda strategy, target, drafter, selector: TopKProposer(strategy, drafter),
    "dynatree": lambda strategy, target, drafter, selector: DynaTreeProposer(strategy, drafter),
    "nde": lambda strategy, target, drafter, selector: NdeProposer(strategy, target, drafter, selector),
}
assert set(PROPOSERS) == set(SAMPLING_VERIFIERS), "every strategy shape has a proposer"


def make_proposer(strategy: Strategy, target: Any, drafter: Drafter | None,
                  selector: NdeSelector | None = None) -> Proposer:
    """The proposer of ``strategy`` drafting with ``drafter`` (``selector``: the NDE selector, for ``nde``)."""
    if isinstance(drafter, DualDrafter):
        return DualProposer(strategy, drafter)
    return PROPOSERS[strategy.shape](strategy, target, drafter, selector)
