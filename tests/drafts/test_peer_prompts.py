"""bench/peers.py's prompts are disjoint from every prompt whose answers went into the retrieval datastore or a
draft's training data (the hand-written training prompts and the whole synthetic pool, of which the drafts
used the first ``TrainConfig.synthetic_prompts`` and the selector data set the next ones), and the benchmark
module loads without llama-cpp-python."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.peers import WORKLOADS
from spec_fast.drafts.prompts import HELDOUT_PROMPTS, TRAIN_PROMPTS, load_prompt_sets, synthetic_prompts
from spec_fast.drafts.retrieval import load_datastore
from spec_fast.drafts.training import TrainConfig

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _normal(text: str) -> str:
    return " ".join(text.casefold().split())


def _pool() -> list[str]:
    sets = load_prompt_sets()
    return list(TRAIN_PROMPTS) + synthetic_prompts(len(sets.synthetic_templates) * len(sets.synthetic_subjects)
                                                   - len(_excluded()))


def _excluded() -> set[str]:
    # synthetic_prompts drops templates x subjects that equal a held-out or hand-written prompt
    sets = load_prompt_sets()
    held = {_normal(p) for p in sets.heldout + sets.train}
    return {c for s in sets.synthetic_subjects for t in sets.synthetic_templates
            if _normal(c := t.format(s=s)) in held}


def overlaps(benchmark: dict[str, tuple[str, ...]], used: list[str]) -> list[tuple[str, str]]:
    """``(workload, used prompt)`` for every used prompt equal to, or contained in, a benchmark prompt."""
    normal_used = {_normal(p) for p in used}
    hits = []
    for workload, prompts in benchmark.items():
        for prompt in prompts:
            text = _normal(prompt)
            hits += [(workload, u) for u in normal_used if u == text or u in text]
    return hits


def test_used_pool_covers_what_the_drafts_and_the_datastore_were_built_from() -> None:
    pool = set(_pool())
    assert set(TRAIN_PROMPTS) <= pool
    assert set(synthetic_prompts(TrainConfig.synthetic_prompts, TrainConfig.seed)) <= pool
    _, meta = load_datastore()
    assert meta["prompts"].startswith("TRAIN_PROMPTS + synthetic_prompts")


def test_benchmark_prompts_are_disjoint_from_every_training_or_datastore_prompt() -> None:
    assert all(len(p) >= 3 for p in WORKLOADS.values())
    assert overlaps(WORKLOADS, _pool()) == []
    assert set(WORKLOADS["chat"]) <= set(HELDOUT_PROMPTS)  # the held-out evaluation set


def test_a_training_prompt_in_a_workload_is_caught() -> None:
    """Negative control: the same check reports a training prompt, and one wrapped in other text."""
    planted = {"chat": (*WORKLOADS["chat"], TRAIN_PROMPTS[3].upper()),
               "long": (f"Some document.\n\nQuestion: {synthetic_prompts(5)[2]}",)}
    hits = overlaps(planted, _pool())
    assert {w for w, _ in hits} == {"chat", "long"}


def test_benchmark_module_does_not_need_llama_cpp() -> None:
    code = "import sys, bench.peers; assert 'llama_cpp' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_oracle_replay_draft_is_accepted_in_full_and_keeps_the_greedy_output() -> None:
    """The oracle ceiling of bench/peers.py: replaying the target's own greedy reply, chain:4 commits 5 tokens
    per target pass; replaying a wrong reply (negative control) falls back to one token per pass."""
    from bench.peers import ReplayDrafter
    from spec_fast.engine import SpeculativeDecoder
    from spec_fast.strategies import parse_strategy
    from tests.engine.models import tiny_llama

    model = tiny_llama(vocab_size=64, layers=2, seed=1)
    prompt, new = [3, 9, 27, 5], 20
    plain = SpeculativeDecoder(model, None, parse_strategy("ar")).generate([prompt], max_new_tokens=new).tokens[0]
    assert len(plain) == new
    passes = {}
    for name, reply in (("oracle", plain), ("wrong", [(t + 1) % 64 for t in plain])):
        drafter = ReplayDrafter(64)
        drafter.reference = prompt + reply
        result = SpeculativeDecoder(model, drafter, parse_strategy("chain:4")).generate([prompt], max_new_tokens=new)
        assert result.tokens[0] == plain
        passes[name] = result.metrics.target_passes
    assert passes["oracle"] == new // 5
    assert passes["wrong"] > 2 * passes["oracle"]
