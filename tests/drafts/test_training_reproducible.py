"""Training is deterministic on CPU: two small runs with the same seed give identical weights, and a
different seed gives different ones (so the comparison can fail)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from spec_fast.drafts.training import TrainConfig, teacher_forcing, train_distilled, train_head, vocabulary_subset
from tests.engine.models import tiny_llama

PAIRS = [([1, 5, 7, 9], [3, 11, 2, 60, 7, 7]), ([4, 2], [8, 8, 8, 1, 9]), ([60, 61, 3], [2, 4, 6, 8, 10, 12, 14])]


def _states(target: Any, data: Any, vocab_ids: torch.Tensor, config: TrainConfig) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    draft = train_distilled(target, data, vocab_ids, config, (0, 3))
    out.update({f"distilled.{k}": v for k, v in draft.state_dict().items() if k.startswith("model.layers.")})
    for kind in ("eagle", "rnn"):
        out.update({f"{kind}.{k}": v for k, v in train_head(target, kind, data, vocab_ids, config).new_state().items()})
    return out


@pytest.fixture(scope="module")
def setup() -> tuple[Any, Any, torch.Tensor]:
    torch.set_num_threads(1)
    target = tiny_llama()
    for p in target.parameters():
        p.requires_grad_(False)
    data = teacher_forcing(target, PAIRS, top_k=8, batch_size=2)
    vocab_ids = vocabulary_subset(data, 40, 64, special_ids=[0])
    return target, data, vocab_ids


def test_two_training_runs_with_the_same_seed_give_identical_weights(setup: tuple[Any, Any, torch.Tensor]) -> None:
    target, data, vocab_ids = setup
    config = TrainConfig(batch_size=2, steps_distilled=4, steps_head=4, seed=3)
    first, second = _states(target, data, vocab_ids, config), _states(target, data, vocab_ids, config)
    assert first.keys() == second.keys() and len(first) > 0
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = _states(target, data, vocab_ids, TrainConfig(batch_size=2, steps_distilled=4, steps_head=4, seed=4))
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_vocabulary_subset_keeps_special_ids_and_the_most_frequent_tokens(setup: tuple[Any, Any, torch.Tensor]) -> None:
    _, data, vocab_ids = setup
    ids = set(vocab_ids.tolist())
    assert len(ids) == 40 and 0 in ids and {8, 7, 2} <= ids
    assert vocab_ids.tolist() == sorted(ids)


def test_heldout_agreement_is_one_for_the_target_itself_and_counts_only_response_positions(
    setup: tuple[Any, Any, torch.Tensor],
) -> None:
    from spec_fast.drafts.heads import FeatureHead
    from spec_fast.drafts.training import heldout_agreement

    target, data, vocab_ids = setup
    assert heldout_agreement(target, data) == [1.0]  # the teacher agrees with itself at every position
    # a draft that always says token 0: agreement = share of response positions whose target argmax is 0
    constant = _Constant(64)
    position = torch.arange(data.tokens.shape[1]).unsqueeze(0)
    valid = (position < data.lengths.unsqueeze(1) - 1) & (position >= data.prompt_lengths.unsqueeze(1) - 1)
    expected = float(((data.top_ids[..., 0] == 0) & valid).sum()) / float(valid.sum())
    assert heldout_agreement(constant, data) == [pytest.approx(expected)]
    head = FeatureHead(target, "rnn", vocab_ids)  # untrained: two steps, each a fraction
    scores = heldout_agreement(head, data)
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)


class _Constant(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids: torch.Tensor, **_: Any) -> Any:
        logits = torch.zeros(*input_ids.shape, self.vocab)
        logits[..., 0] = 1.0
        return type("Out", (), {"logits": logits})()
