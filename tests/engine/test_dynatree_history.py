"""The engine's DynaTree history adjustment follows :mod:`spec_ref.dynatree` step by step: replaying the
engine's accepted lengths through ``spec_ref.draft_dynatree`` / ``update_history`` gives, at every step, the
tree the engine drafted (its history-adjusted parameters decided it) and, at the end, the same history."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.strategies import parse_strategy
from spec_ref.dynatree import DynaTreeHistory, draft_dynatree, update_history
from tests.engine.models import tiny_llama

TARGET = tiny_llama(vocab_size=16, seed=11)


def _paths(tokens: list[int], parents: list[int], valid: list[bool]) -> set[tuple[int, ...]]:
    paths: dict[int, tuple[int, ...]] = {0: ()}
    for i in range(1, len(tokens)):
        if valid[i]:
            paths[i] = paths[parents[i]] + (tokens[i],)
    return set(paths.values())


@pytest.mark.parametrize("layers,spec", [
    (3, "dynatree:2,4,10"), (1, "dynatree:1,3,6"),
    # every parameter of the strategy string away from its default: thresholds, branch bounds, depth
    # gating, pruning, window and the history schedule reach the engine's builder and history
    (3, "dynatree:d0=1,dmax=4,budget=12,tau_high=0.6,tau_low=0.2,branch_min=1,branch_mid=3,branch_max=4,"
        "rho_stop=0.02,rho_deep=0.2,prune=0.01,window=2,high_acceptance=0.6,low_acceptance=0.4,"
        "threshold_step=0.1,depth_step=2"),
    (1, "dynatree:2,5,9,tau_high=0.5,tau_low=0.15,branch_mid=1,prune=0.03,window=3,low_acceptance=0.5"),
])
def test_dynatree_history_matches_spec_ref_step_by_step(layers: int, spec: str) -> None:
    drafter = EarlyExitDrafter(TARGET, layers)
    strategy = parse_strategy(spec)
    prompt = [1, 2, 3]
    steps: list[list[int]] = []
    result = SpeculativeDecoder(TARGET, drafter, strategy).generate(
        [prompt], max_new_tokens=40, on_tokens=lambda new: steps.append(list(new[0])), record_trees=True)
    assert result.state is not None

    def model(context: list[int]) -> Any:
        def probs(prefix: tuple[int, ...]) -> np.ndarray:
            with torch.no_grad():
                logits = drafter.model(torch.tensor([context + list(prefix)])).logits[0, -1].double()
            return torch.softmax(logits, dim=-1).numpy()
        return probs

    history = DynaTreeHistory(window=strategy.dynatree_window)
    context = list(prompt)
    compared = 0
    adjusted = False
    for tree, new in zip(result.trees, steps):
        got = _paths(tree.tokens[0].tolist(), tree.parents[0].tolist(), tree.valid[0].tolist())
        depth = int(tree.depths[0].max())
        if depth == 0:  # the last step may draft nothing (one token left)
            break
        full = len(result.tokens[0]) - (len(context) - len(prompt)) - 1 >= strategy.depth
        if full:
            ref_tree, pending = draft_dynatree(model(context), strategy.dynatree_params(), history)
            paths = {ref_tree.path_tokens(u) for u in range(ref_tree.num_nodes)}
            assert got == paths
            compared += 1
        else:  # the engine lowered D_max to the tokens left: record the depth it drafted
            pending = replace(history, pending_depth=depth)
        before = history.acceptance
        history = update_history(pending, len(new) - 1)
        adjusted = adjusted or (before and history.acceptance != before)
        context += new
    assert compared >= 3 and adjusted
    assert result.state.proposal.history[0].acceptance == history.acceptance
