"""scripts/selector_dataset.py: its prompts come from the training pool but were never used to train the
drafts and are never evaluation prompts; its shared draws on tiny random models are valid delayed-tree
draws (every token drafted with positive draft mass at its prefix, prefixes merged, parents first)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from spec_fast.decoding import decoding_operator
from spec_fast.drafts.model import ModelDrafter
from spec_fast.drafts.prompts import HELDOUT_PROMPTS, TRAIN_PROMPTS, synthetic_prompts
from spec_fast.drafts.training import TrainConfig
from tests.engine.models import tiny_llama

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "selector_dataset.py")


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("selector_dataset", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prompts_are_the_unused_part_of_the_training_pool() -> None:
    script = _script()
    prompts = script.selector_prompts(60)
    assert len(prompts) == len(set(prompts)) == 60
    used_by_drafts = set(synthetic_prompts(TrainConfig.synthetic_prompts, TrainConfig.seed)) | set(TRAIN_PROMPTS)
    assert used_by_drafts.isdisjoint(prompts)
    assert set(HELDOUT_PROMPTS).isdisjoint(prompts)
    assert prompts[:5] == script.selector_prompts(5)  # a prefix-stable order


def test_shared_draws_on_a_tiny_model_are_valid() -> None:
    script = _script()
    drafter = ModelDrafter(tiny_llama(vocab_size=64, layers=1, seed=4))
    cache = drafter.begin(1, torch.device("cpu"))
    context = [3, 9, 27, 17, 5]
    with torch.no_grad():
        logits = drafter.forward(cache, torch.tensor([context]), (torch.arange(len(context)) - 1).unsqueeze(0))
        q_root = script._probs(logits[0, -1:], 1.0, 0.9)[0]
        trees = script.RootTrees(drafter, cache, len(context) - 1, q_root, 1.0, 0.9, torch.Generator().manual_seed(0))
        draws = trees.draw(2)
    assert len(draws) == 2
    for d in draws:
        assert len(d.spine) == 16 and len(d.extra) == 9 and all(len(row) == 3 for row in d.extra)
        for prefix, token in [(d.spine[:j], d.spine[j]) for j in range(16)] + [
            (d.spine[:l1] + b[:j], b[j]) for l1, row in enumerate(d.extra) for b in row for j in range(8)
        ]:
            assert float(trees.q[prefix][token]) > 0  # drafted from the law recorded at its prefix
    # every recorded prefix is forwarded once, after its parent
    seen = {()}
    for prefix in trees.order:
        assert prefix[:-1] in seen and prefix not in seen
        seen.add(prefix)
    assert cache.num_block == len(context) + len(trees.order)


def test_fast_laws_equal_the_decoding_operator() -> None:
    """The dataset's G (top-p resolved among the top candidates, the full operator when the nucleus is
    wider) has G's support and values up to float rounding; a control with top-p ignored differs."""
    script = _script()
    torch.manual_seed(0)
    logits = torch.randn(6, 3000) * 4
    logits[1] = torch.randn(3000) * 0.01  # a flat row: the nucleus is wider than the candidates
    logits[2, 100:] = -float("inf")  # a vocabulary subset
    for temperature, top_p in ((0.6, 0.9), (1.0, 0.9), (1.0, 1.0)):
        exact = decoding_operator(logits, torch.full((6,), temperature), torch.zeros(6, dtype=torch.long),
                                  torch.full((6,), top_p))
        fast = script._probs(logits, temperature, top_p)
        assert torch.equal(fast > 0, exact > 0)
        torch.testing.assert_close(fast, exact, atol=1e-6, rtol=1e-5)
    nucleus = decoding_operator(logits, torch.ones(6), torch.zeros(6, dtype=torch.long), torch.full((6,), 0.9)) > 0
    assert not torch.equal(script._probs(logits, 1.0, 1.0) > 0, nucleus)  # the control: top-p does cut


def test_root_records_match_teacher_forcing() -> None:
    """PromptRun (the target samples, the draft catches up at each root) hands the features the laws and
    hidden states of a plain teacher-forced forward of both models at the token before the root and at it."""
    script = _script()
    target, draft = tiny_llama(vocab_size=64, layers=2, seed=5), tiny_llama(vocab_size=64, layers=1, seed=6)
    run = script.PromptRun(target, ModelDrafter(draft), [3, 9, 27, 17, 5], 1.0, 1.0, seed=0)
    with torch.no_grad():
        for _ in range(2):
            run.sample(4)
            prev_and_root_logits, prev_and_root_hidden, _, _, root_entry = run.draft_root()
            sequence = torch.tensor([run.sequence])
            t_out = target(sequence, output_hidden_states=True)
            d_out = draft(sequence, output_hidden_states=True)
            torch.testing.assert_close(run.hidden[-2], t_out.hidden_states[-1][0, -2], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(run.logits[0], t_out.logits[0, -2], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(run.logits[-1], t_out.logits[0, -1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(prev_and_root_logits, d_out.logits[0, -2:], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(prev_and_root_hidden, d_out.hidden_states[-1][0, -2:], atol=1e-5, rtol=1e-5)
            assert root_entry == run.drafter.num_block(run.draft_state) - 1
            run.finish_root()


def test_root_records_of_a_feature_head_match_teacher_forcing() -> None:
    """With a trained-head drafter (rnn), each pending token reads the target's feature of the token before
    it, as in the engine: the root's logits and predicted features equal the head run on the true features."""
    from spec_fast.drafts.heads import FeatureHead, HeadDrafter

    script = _script()
    target = tiny_llama(vocab_size=64, layers=2, seed=5)
    torch.manual_seed(1)
    head = FeatureHead(target, "rnn", torch.arange(64)).eval()
    run = script.PromptRun(target, HeadDrafter(head), [3, 9, 27, 17, 5], 1.0, 1.0, seed=0)
    with torch.no_grad():
        for _ in range(2):
            run.sample(3)
            logits, hidden, _, _, _ = run.draft_root()
            sequence = torch.tensor([run.sequence])
            features = target(sequence, output_hidden_states=True).hidden_states[-1]
            previous = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
            want = head.features(head.embed[0](sequence), previous)
            torch.testing.assert_close(hidden, want[0, -2:], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(logits, head.head(want)[0, -2:], atol=1e-5, rtol=1e-5)
            run.finish_root()
