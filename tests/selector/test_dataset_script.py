"""scripts/selector_dataset.py: its prompts come from the training pool but were never used to train the
drafts and are never evaluation prompts; its shared draws on tiny random models are valid delayed-tree
draws (every token drafted with positive draft mass at its prefix, prefixes merged, parents first)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from spec_fast.kv_cache import TreeKVCache
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
    draft = tiny_llama(vocab_size=64, layers=1, seed=4)
    cache = TreeKVCache(draft, 1, torch.device("cpu"))
    context = [3, 9, 27, 17, 5]
    with torch.no_grad():
        out = cache.forward(torch.tensor([context]), (torch.arange(len(context)) - 1).unsqueeze(0))
        q_root = script._probs(out.logits[0, -1:], 1.0, 0.9)[0]
        trees = script.RootTrees(cache, len(context) - 1, q_root, 1.0, 0.9, torch.Generator().manual_seed(0))
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
