"""Draft heads on a tiny random Llama: exact greedy output, and heads advance from the verifier's features.

No trained weights and no download: heads are built untrained (random) on ``tests.engine.models.tiny_llama``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from spec_fast.engine import SpeculativeDecoder
from spec_fast.drafts.heads import FeatureHead, HeadDrafter, SubsetHead, distilled_model
from spec_fast.drafts.model import ModelDrafter
from spec_fast.lean import native
from spec_fast.strategies import parse_strategy
from tests.engine.models import hf_greedy, tiny_llama

STRATEGIES = ["chain:1", "chain:4", "iid:2x3", "delayed:2,1,3", "topk:3,2,6", "dynatree", "chain:3+adaptive"]
PROMPTS = [[1, 5, 7, 9, 3], [4, 2], [8, 8, 8, 8, 8, 8, 8, 1], [60]]
NEW_TOKENS = 20
VOCAB_SUBSET = torch.arange(0, 64, 2)  # every other token: the drafts can never propose odd ids


def _head(target: Any, kind: str, seed: int = 1) -> FeatureHead:
    torch.manual_seed(seed)
    head = FeatureHead(target, kind, VOCAB_SUBSET)
    for p in head.parameters():
        p.requires_grad_(False)
    return head.eval()


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_llama()


@pytest.fixture(scope="module")
def reference(target: Any) -> list[list[int]]:
    return [hf_greedy(target, p, NEW_TOKENS) for p in PROMPTS]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("kind", ["eagle", "rnn", "distilled"])
def test_greedy_output_with_each_draft_kind_equals_hf_generate_on_a_ragged_batch(
    target: Any, reference: list[list[int]], kind: str, strategy: str
) -> None:
    drafter = (ModelDrafter(distilled_model(target, VOCAB_SUBSET, (0, 3))) if kind == "distilled"
               else HeadDrafter(_head(target, kind)))
    result = SpeculativeDecoder(target, drafter, parse_strategy(strategy)).generate(PROMPTS, NEW_TOKENS)
    assert result.tokens == reference


def test_subset_head_scores_the_subset_exactly_like_the_lm_head_and_nothing_else(target: Any) -> None:
    head = SubsetHead(target.get_output_embeddings(), VOCAB_SUBSET)
    hidden = torch.randn(3, 5, target.config.hidden_size)
    full = target.get_output_embeddings()(hidden)
    logits = head(hidden)
    assert torch.equal(logits[..., VOCAB_SUBSET], full[..., VOCAB_SUBSET])
    outside = torch.ones(64, dtype=torch.bool)
    outside[VOCAB_SUBSET] = False
    assert bool(torch.isneginf(logits[..., outside]).all())


@pytest.mark.usefixtures("native_kernels")
def test_subset_head_on_the_native_kernel_scores_like_torch_and_leaves_training_on_torch(target: Any) -> None:
    head = SubsetHead(target.get_output_embeddings(), VOCAB_SUBSET)
    hidden = torch.randn(3, 5, target.config.hidden_size)
    with torch.no_grad():
        on_torch = head(hidden)
        head.use_native(True)
        assert head.packed is not None
        on_kernel = head(hidden)
    # another summation order: equal to rounding, and not the torch path in disguise
    torch.testing.assert_close(on_kernel, on_torch, rtol=1e-5, atol=1e-5)
    assert bool(torch.isneginf(on_kernel[..., 1::2]).all())
    trained = hidden.clone().requires_grad_(True)  # training needs gradients: the torch product
    logits = head(trained)
    assert torch.equal(logits, on_torch)
    logits[..., VOCAB_SUBSET].sum().backward()
    assert trained.grad is not None
    head.use_native(False)
    assert head.packed is None


@pytest.mark.usefixtures("native_kernels")
def test_a_head_on_the_native_kernel_keeps_greedy_output_exact(target: Any, reference: list[list[int]]) -> None:
    head = _head(target, "rnn")
    head.head.use_native(True)
    result = SpeculativeDecoder(target, HeadDrafter(head), parse_strategy("chain:3")).generate(PROMPTS, NEW_TOKENS)
    assert result.tokens == reference


def test_rnn_head_drafts_from_the_verifiers_true_feature_of_the_previous_token(target: Any) -> None:
    """With chain:1 every step's draft token is the head's argmax at the root, which must read the target's
    feature of the token before the root (seed 000 (docs/papers.md) section 7), whatever was accepted before."""
    head = _head(target, "rnn")
    decoder = SpeculativeDecoder(target, HeadDrafter(head), parse_strategy("chain:1"))
    prompt = PROMPTS[0]
    result = decoder.generate([prompt], NEW_TOKENS, record_trees=True)
    text = prompt + result.tokens[0]
    with torch.no_grad():
        features = target(torch.tensor([text]), output_hidden_states=True).hidden_states[-1][0]  # [T, H]
        embeds = head.embed[0](torch.tensor(text))
        prev = torch.cat([torch.zeros_like(features[:1]), features[:-1]])
        expected = head.head(head.features(embeds.unsqueeze(0), prev.unsqueeze(0)))[0].argmax(-1)  # [T]
    root = len(prompt) - 1  # position of the root token of the first step
    checked = 0
    for tree in result.trees:
        if tree.num_slots < 2:  # the last step drafts nothing
            continue
        assert int(tree.tokens[0, 1]) == int(expected[root])
        checked += 1
        accepted = 1 if int(tree.tokens[0, 1]) == text[root + 1] else 0
        root += accepted + 1
    assert checked >= NEW_TOKENS // 2


def test_two_heads_of_different_kinds_have_different_costs(target: Any) -> None:
    eagle, rnn = _head(target, "eagle"), _head(target, "rnn")
    n_eagle = sum(p.numel() for p in eagle.new_state().values())
    n_rnn = sum(p.numel() for p in rnn.new_state().values())
    assert hasattr(eagle, "layer") and not hasattr(rnn, "layer")
    assert n_rnn < n_eagle


def test_feature_head_rejects_a_forward_without_staged_features(target: Any) -> None:
    head = _head(target, "rnn")
    with pytest.raises(ValueError, match="staged_features"):
        head(torch.tensor([[1, 2]]))


def test_unknown_head_kind_and_draft_name_are_rejected_by_name(target: Any) -> None:
    from spec_fast.drafts.heads import load_drafter, weights_path

    with pytest.raises(ValueError, match="kind='medusa'"):
        FeatureHead(target, "medusa", VOCAB_SUBSET)
    with pytest.raises(ValueError, match="name='tiny'"):
        load_drafter("tiny", target)
    with pytest.raises(ValueError, match="name='tiny'"):
        weights_path("tiny")
