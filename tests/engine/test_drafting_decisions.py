"""The engine's deterministic trees make the same decisions as the spec_ref drafting rules.

The first tree drafted from a prompt (as a set of root-to-node token paths, and the draw order at each
node) equals :func:`spec_ref.draft_topk_tree` / :func:`spec_ref.draft_dynatree` run on the draft model's
float64 next-token distributions. Random tiny models: ties or threshold hits within float32 rounding are
not expected at these sizes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.flat_tree import FlatTree
from spec_fast.strategies import parse_strategy
from spec_ref.drafting import draft_topk_tree
from spec_ref.dynatree import DynaTreeHistory, DynaTreeParams, draft_dynatree
from tests.engine.models import tiny_llama

TARGET = tiny_llama(vocab_size=16, seed=11)
DRAFTER = EarlyExitDrafter(TARGET, 1)
PROMPTS = [[1, 2, 3], [7], [4, 4, 9, 12]]


def _draft_model(prompt: list[int]) -> Any:
    def model(prefix: tuple[int, ...]) -> np.ndarray:
        with torch.no_grad():
            logits = DRAFTER.model(torch.tensor([prompt + list(prefix)])).logits[0, -1].double()
        return torch.softmax(logits, dim=-1).numpy()

    return model


def _engine_tree(strategy: str, prompt: list[int], drafter: Any = DRAFTER
                 ) -> tuple[set[tuple[int, ...]], dict[tuple[int, ...], list[int]]]:
    decoder = SpeculativeDecoder(TARGET, drafter, parse_strategy(strategy))
    tree: FlatTree = decoder.generate([prompt], max_new_tokens=12, record_trees=True).trees[0]
    tokens, parents, valid = tree.tokens[0].tolist(), tree.parents[0].tolist(), tree.valid[0].tolist()
    paths: dict[int, tuple[int, ...]] = {0: ()}
    for i in range(1, len(tokens)):
        if valid[i]:
            paths[i] = paths[parents[i]] + (tokens[i],)
    draws = {paths[i]: [t for t in tree.draws[0, i].tolist() if t >= 0] for i in paths}
    return set(paths.values()), draws


def _reference_tree(tree: Any) -> tuple[set[tuple[int, ...]], dict[tuple[int, ...], list[int]]]:
    paths: dict[int, tuple[int, ...]] = {0: ()}
    for i in range(1, tree.num_nodes):
        paths[i] = paths[tree.parents[i]] + (tree.tokens[i],)
    draws = {paths[i]: list(tree.draws[i]) for i in paths}
    return set(paths.values()), draws


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("depth,top_k,budget", [(3, 2, 6), (4, 3, 10), (2, 4, 5)])
def test_topk_trees_equal_the_reference_rule(prompt: list[int], depth: int, top_k: int, budget: int) -> None:
    got = _engine_tree(f"topk:{depth},{top_k},{budget}", prompt)
    want = _reference_tree(draft_topk_tree(_draft_model(prompt), depth, top_k, budget))
    assert got == want


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("d0,dmax,budget", [(5, 8, 64), (2, 4, 10), (1, 3, 6)])
def test_dynatree_trees_equal_the_reference_rule(prompt: list[int], d0: int, dmax: int, budget: int) -> None:
    got = _engine_tree(f"dynatree:{d0},{dmax},{budget}", prompt)
    params = DynaTreeParams(base_depth=d0, max_depth=dmax, node_budget=budget)
    tree, _ = draft_dynatree(_draft_model(prompt), params, DynaTreeHistory())
    assert got == _reference_tree(tree)


# ---- ties: a retrieval draft gives exact ties and point masses (q = 1), so a child can have its parent's
# confidence and a lower token id; the engine must still pick best-first with the reference's tie rule
_TIE_SEQS = [[9, 5, 3, 1], [9, 5, 3, 1], [9, 6, 2, 0], [9, 7, 4, 4], [9, 7, 4, 2]]


def _retrieval_model(drafter: Any, prompt: list[int]) -> Any:
    def model(prefix: tuple[int, ...]) -> np.ndarray:
        _, counts = drafter.law(prompt + list(prefix))
        with np.errstate(divide="ignore"):
            logits = torch.from_numpy(np.log(counts).astype(np.float32))
        # the engine's own float32 law, so both sides multiply identical confidences
        return torch.softmax(logits, dim=-1).double().numpy()

    return model


@pytest.mark.parametrize("depth,top_k,budget", [(2, 2, 1), (3, 2, 2), (3, 3, 4), (3, 2, 5), (2, 3, 3)])
def test_topk_trees_with_ties_and_point_masses_equal_the_reference_rule(depth: int, top_k: int, budget: int) -> None:
    from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex

    drafter = RetrievalDrafter(SuffixIndex(_TIE_SEQS, 16, 4), 16, 4)
    prompt = [11, 9]
    got = _engine_tree(f"topk:{depth},{top_k},{budget}", prompt, drafter)
    assert got == _reference_tree(draft_topk_tree(_retrieval_model(drafter, prompt), depth, top_k, budget))


@pytest.mark.parametrize("d0,dmax,budget", [(1, 3, 6), (2, 3, 8), (1, 2, 3), (1, 2, 2)])
def test_dynatree_trees_with_ties_equal_the_reference_rule(d0: int, dmax: int, budget: int) -> None:
    """Exact ties in the retrieval law (tokens 5 and 7 both follow 9 twice): DynaTree's branching takes
    the tied children lowest id first, like the reference; a highest-id tie rule changes the draw order
    (and, at a budget cut, the tree)."""
    from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex

    drafter = RetrievalDrafter(SuffixIndex(_TIE_SEQS, 16, 4), 16, 4)
    prompt = [11, 9]
    got = _engine_tree(f"dynatree:{d0},{dmax},{budget}", prompt, drafter)
    params = DynaTreeParams(base_depth=d0, max_depth=dmax, node_budget=budget)
    tree, _ = draft_dynatree(_retrieval_model(drafter, prompt), params, DynaTreeHistory())
    assert got == _reference_tree(tree)
