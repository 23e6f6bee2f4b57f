"""The systematic comparison's own machinery (bench/study.py) on a tiny random Llama (V = 8) with its
early-exit draft: the recorded steps are real engine steps, and on them

* at every recorded root, BV's exact expected block efficiency over the drafted chain (every chain of the
  draft enumerated with its probability) is >= naive's (docs/algorithms.md section 5; for single drafted
  chains it need not be, and the recorded data show cases where it is not);
* SpecTr, SpecInfer, Khisti and NaiveTree equal naive on one-path trees (footnote 2 of seed 002; NSS does
  not: it accepts a drafted x with p(x) <= min(1, p(x)/q(x)), so it is checked to be <= naive instead);
* Traversal equals BV at K = 1 (exact enumeration of the Traversal verifier on the recorded trees);
* the paired table evaluates every OT method on the same recorded trees: its means are the per-tree
  expectations averaged, and on one-path trees it reproduces the K = 1 reductions (differences from
  SpecInfer 0 except NSS's, which is negative);
* the measured mean of tau + 1 is within its confidence interval of the exact expectation (two-sided
  z-test at alpha 1e-6; a wrong expectation, NSS's on a naive run, is rejected by the same test, with the
  gap certified to give power 0.99).

The study prompts are disjoint from every prompt behind a draft or the datastore."""

from __future__ import annotations

import itertools
import json
import math
import os
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import norm

from bench.study import (
    OT,
    PROMPTS_PATH,
    RecordingDecoder,
    StepRecord,
    expected_be,
    load_prompts,
    paired_expectations,
    target_model,
)
from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.engine import SamplingParams
from spec_fast.strategies import parse_strategy
from spec_ref.decoding import decoding_operator
from spec_ref.efficiency import exact_block_efficiency, expected_block_efficiency
from spec_ref.tree import DraftTree
from tests.drafts.test_peer_prompts import _pool, overlaps
from tests.engine.models import tiny_llama

VOCAB = 8
ROWS = 256
TARGET = tiny_llama(vocab_size=VOCAB, layers=2, seed=5, hidden=16)
DRAFTER = EarlyExitDrafter(TARGET, 1)
ALPHA = 1e-6
Z = float(norm.ppf(1 - ALPHA / 2))


def _records(strategy: str, method: str, temperature: float = 0.9, rows: int = ROWS) -> list[StepRecord]:
    decoder = RecordingDecoder(TARGET, DRAFTER, parse_strategy(strategy, method))
    decoder.generate([[1, 2]] * rows, max_new_tokens=4, sampling=SamplingParams(temperature=temperature, seed=7))
    assert decoder.records
    return decoder.records


@pytest.fixture(scope="module")
def chain_records() -> list[StepRecord]:
    return _records("chain:2", "naive")


def test_study_prompts_cover_five_kinds_and_are_held_out() -> None:
    kinds = load_prompts()
    assert len(kinds) == 5 and all(len(p) >= 4 for p in kinds.values())
    with open(PROMPTS_PATH) as fh:
        assert "Written for spec-verify" in json.load(fh)["source"]
    assert overlaps({k: tuple(v) for k, v in kinds.items()}, _pool()) == []
    planted = {"code": (_pool()[0] + " please",)}
    assert overlaps(planted, _pool())  # the check can fail


def test_recorded_trees_are_the_engines(chain_records: list[StepRecord]) -> None:
    for r in chain_records[:20]:
        assert r.tree.tokens[0] == -1 and 1 <= r.tree.max_depth <= 2
        assert r.target.shape == (r.tree.num_nodes, VOCAB)
        np.testing.assert_allclose(r.target.sum(axis=1), 1.0, atol=1e-12)
        assert 0 <= r.accepted_depth <= r.tree.max_depth


def _probs(model: Any, context: tuple[int, ...]) -> np.ndarray:
    """G(model's logits) after ``context`` (T = 0.9, no truncation), ``[V]`` float64: the engine's law."""
    with torch.no_grad():
        logits = model(torch.tensor([list(context)])).logits[0, -1].double().numpy()
    return np.asarray(decoding_operator(logits, 0.9, None, 1.0))


def _over_drafts(context: tuple[int, ...], method: str, length: int = 2) -> float:
    """E over every drafted chain of ``length`` tokens (drawn from the draft's law) of E[tau + 1 | chain]."""
    total = 0.0
    for chain in itertools.product(range(VOCAB), repeat=length):
        q = [_probs(DRAFTER.model, context + chain[:i]) for i in range(length)]
        weight = float(np.prod([q[i][t] for i, t in enumerate(chain)]))
        if weight == 0:
            continue
        p = np.array([_probs(TARGET, context + chain[:i]) for i in range(length + 1)])
        tree = DraftTree(tokens=(-1, *chain), parents=tuple(range(-1, length)),
                         draws=tuple((t,) for t in chain) + ((),), draft_probs=(*q, None))
        total += weight * float(expected_block_efficiency(tree, target_model(tree, p), method))
    return total


def test_recorded_laws_are_the_models_at_the_recorded_context(chain_records: list[StepRecord]) -> None:
    for r in chain_records[:10]:
        np.testing.assert_allclose(r.target[0], _probs(TARGET, r.context), atol=1e-6)
        np.testing.assert_allclose(r.tree.draft_probs[0], _probs(DRAFTER.model, r.context), atol=1e-6)


def test_bv_is_at_least_naive_at_every_recorded_root(chain_records: list[StepRecord]) -> None:
    roots = sorted({r.context for r in chain_records if r.tree.max_depth == 2})[:8]
    gaps = [_over_drafts(c, "bv") - _over_drafts(c, "naive") for c in roots]
    assert len(roots) >= 3 and min(gaps) >= -1e-12
    assert max(gaps) > 1e-6  # BV strictly gains somewhere: the comparison is not vacuous
    per_tree = [expected_be(r, "bv") - expected_be(r, "naive") for r in chain_records]
    assert min(per_tree) < 0 < max(per_tree)  # single drafted chains go either way


@pytest.mark.parametrize("method", ["spectr", "specinfer", "khisti", "naive_tree"])
def test_ot_methods_equal_naive_on_one_path(chain_records: list[StepRecord], method: str) -> None:
    for r in chain_records[:40]:
        assert expected_be(r, method) == pytest.approx(expected_be(r, "naive"), abs=1e-9)


def test_nss_is_at_most_naive_on_one_path(chain_records: list[StepRecord]) -> None:
    gaps = [expected_be(r, "naive") - expected_be(r, "nss") for r in chain_records]
    assert min(gaps) >= -1e-12 and max(gaps) > 1e-6


def test_traversal_equals_bv_at_k1_by_enumeration(chain_records: list[StepRecord]) -> None:
    for r in chain_records[:6]:
        enumerated = exact_block_efficiency(r.tree, target_model(r.tree, r.target), "traversal")
        assert float(enumerated) == pytest.approx(expected_be(r, "bv"), abs=1e-9)
        assert expected_be(r, "traversal") == expected_be(r, "bv")


def test_paired_expectations_evaluate_every_ot_method_on_the_same_trees(chain_records: list[StepRecord]) -> None:
    tree_records = _records("iid:2x2", "specinfer", rows=24)
    paired = paired_expectations(tree_records)
    assert paired["trees"] == len(tree_records)
    for method in OT:
        assert paired["mean"][method] == pytest.approx(np.mean([expected_be(r, method) for r in tree_records]))
    assert paired["minus_specinfer"]["specinfer"] == 0.0
    assert any(abs(paired["minus_specinfer"][m]) > 1e-6 for m in OT)  # the methods differ on K = 2 trees
    one_path = paired_expectations(chain_records[:40])
    for method in ("spectr", "khisti", "naive_tree"):
        assert one_path["minus_specinfer"][method] == pytest.approx(0.0, abs=1e-9)
    assert one_path["minus_specinfer"]["nss"] < -1e-6


def _z(records: list[StepRecord], expectations: list[float]) -> float:
    measured = np.array([r.accepted_depth + 1 for r in records], dtype=float)
    diff = measured - np.array(expectations)
    return float(abs(diff.mean()) / (diff.std(ddof=1) / math.sqrt(len(diff))))


@pytest.mark.parametrize(("strategy", "method"), [("chain:2", "naive"), ("chain:2", "bv"), ("iid:2x2", "specinfer"),
                                                  ("iid:2x2", "spectr"), ("delayed:2,1,1", "nss")])
def test_measured_mean_is_within_its_interval_of_the_exact_expectation(strategy: str, method: str) -> None:
    records = _records(strategy, method)
    assert _z(records, [expected_be(r, method) for r in records]) < Z


def test_the_same_interval_rejects_a_wrong_expectation(chain_records: list[StepRecord]) -> None:
    wrong = [expected_be(r, "nss") for r in chain_records]  # NSS's law on a naive run
    right = [expected_be(r, "naive") for r in chain_records]
    measured = np.array([r.accepted_depth + 1 for r in chain_records], dtype=float)
    se = float(np.std(measured - np.array(right), ddof=1)) / math.sqrt(len(chain_records))
    gap = float(np.mean(right) - np.mean(wrong))
    assert gap / se >= Z + float(norm.ppf(0.99))  # power >= 0.99 against this wrong expectation
    assert _z(chain_records, wrong) >= Z


def test_the_recording_hook_leaves_the_tokens_unchanged() -> None:
    from spec_fast.engine import SpeculativeDecoder

    sampling = SamplingParams(temperature=0.9, seed=3)
    plain = SpeculativeDecoder(TARGET, DRAFTER, parse_strategy("iid:2x2", "specinfer"))
    recording = RecordingDecoder(TARGET, DRAFTER, parse_strategy("iid:2x2", "specinfer"))
    prompts: Any = [[1, 2], [3], [4, 5, 6]]
    assert (plain.generate(prompts, max_new_tokens=6, sampling=sampling).tokens
            == recording.generate(prompts, max_new_tokens=6, sampling=sampling).tokens)
