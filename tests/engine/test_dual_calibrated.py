"""Calibrated routing in the engine (``DualDrafter(..., mode="route-calibrated")``, docs/algorithms.md
section 8): greedy output equals AR; on recorded steps the engine's route choice, expected accepted lengths
and calibration counts equal :func:`spec_ref.dual.calibrated_route` / :func:`spec_ref.dual.update_calibration`
run alongside (greedy and T > 0, with and without prior tables), the retrieval head's per-node match lengths
equal its law's recomputed from the text; the calibration is per call (fresh calls and threads sharing a decoder);
and a pair where one head proposes with probability 1 but is always wrong: the seed's route keeps verifying
it, the calibrated route leaves it after the first step. Tiny random models, seconds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from spec_fast import DualDrafter
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.dual import (
    DUAL_MODES, RouteCalibration, RoutePrior, committed_block, head_feature, load_route_prior,
)
from spec_fast.drafts.model import EarlyExitDrafter, ModelDrafter
from spec_fast.engine import DecodeState, SpeculativeDecoder
from spec_fast.strategies import parse_strategy
from spec_ref import dual as ref_dual
from tests.engine.test_dual import AR, DRAFT_MODEL, HEADS, NEW_TOKENS, PROMPTS, TARGET, _row_tree
from tests.engine.threads import run_in_two_threads


@pytest.mark.parametrize("heads,strategy", [("early-exit,model", "chain:3"), ("model,retrieval", "topk:3,2,5"),
                                            ("model,retrieval", "chain:2"), ("same,same", "topk:2,2,4")])
def test_greedy_route_calibrated_output_equals_ar(heads: str, strategy: str) -> None:
    first, second = HEADS[heads]()
    decoder = SpeculativeDecoder(TARGET, DualDrafter(first, second, "route-calibrated"), parse_strategy(strategy))
    result = decoder.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    assert result.tokens == AR
    steps = sum(result.metrics.accepted_length_histogram)
    assert steps - len(PROMPTS) <= sum(result.metrics.head_selected) <= steps
    assert sum(result.metrics.head_accepted_tokens) == sum(
        t * n for t, n in enumerate(result.metrics.accepted_length_histogram))


class _Recorder(SpeculativeDecoder):
    """Records every step's routed draft, verification, active rows, the text so far (ending in the root)
    and the calibration before and after."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.steps: list[tuple[Any, Any, list[bool], list[list[int]], RouteCalibration, RouteCalibration]] = []

    def _commit_phase(self, st: DecodeState, draft: Any, dual: Any, verified: Any, *rest: Any) -> Any:
        before, active, text = st.proposal.calibration, list(st.active), [list(c) for c in st.committed]
        out = super()._commit_phase(st, draft, dual, verified, *rest)
        if dual is not None:
            assert before is not None and st.proposal.calibration is not None
            self.steps.append((dual, verified, active, text, before, st.proposal.calibration))
        return out


def _block(dual: Any, verified: Any, row: int) -> list[int]:
    """Host-side: the tokens committed after the root in ``row`` (accepted draft tokens, then the next)."""
    slots = [int(s) for s in verified.accepted_slots[row].tolist() if s >= 0][1:]
    return [int(dual.batch.tree.tokens[row, s]) for s in slots] + [int(verified.next_token[row])]


def _row_lengths(dual: Any, head: int, row: int) -> list[int] | None:
    """Row ``row`` of a head's per-node match lengths, in :func:`_row_tree`'s node order (valid slots)."""
    lengths = dual.head_match_lengths[head]
    if lengths is None:
        return None
    valid = dual.head_drafts[head].tree.valid[row]
    return [int(m) for m, v in zip(lengths[row].tolist(), valid.tolist()) if v]


def _check_match_lengths(drafter: Any, tree: Any, lengths: list[int], text: list[int]) -> None:
    """Each node's match length is the retrieval law's at the context ending at its parent (the text so far,
    ending in the root, then the drafted path to the parent), recomputed from scratch."""
    assert lengths[0] == -1
    for i in range(1, tree.num_nodes):
        context = text + list(tree.path_tokens(tree.parents[i]))
        assert lengths[i] == drafter.sparse_law(context)[0]


def _random_priors(first: Any, second: Any, seed: int) -> tuple[RoutePrior, RoutePrior]:
    rng = np.random.default_rng(seed)
    return tuple(RoutePrior(f, tuple(float(r) for r in rng.uniform(0.05, 0.95, ref_dual.num_classes(f))))
                 for f in (head_feature(first), head_feature(second)))  # type: ignore[return-value]


@pytest.mark.parametrize("heads,strategy,temperature,prior", [
    ("model,retrieval", "topk:3,2,5", 0.0, True), ("model,retrieval", "topk:3,2,5", 0.9, False),
    ("early-exit,model", "chain:3", 0.0, False), ("early-exit,model", "chain:3", 0.9, True),
    ("model,retrieval", "chain:2", 0.0, False), ("model,retrieval", "chain:2", 0.9, True)])
def test_route_choice_and_calibration_counts_equal_spec_ref_on_recorded_steps(
        heads: str, strategy: str, temperature: float, prior: bool) -> None:
    first, second = HEADS[heads]()
    priors = _random_priors(first, second, 5) if prior else (None, None)
    dual_drafter = DualDrafter(first, second, "route-calibrated", priors)
    decoder = _Recorder(TARGET, dual_drafter, parse_strategy(strategy))
    decoder.generate(PROMPTS, max_new_tokens=NEW_TOKENS, sampling=SamplingParams(temperature=temperature, seed=7))
    assert len(decoder.steps) >= 4
    reference = [dual_drafter.initial_calibration() for _ in PROMPTS]
    assert reference[0].features == (("probability", "match-length") if heads == "model,retrieval"
                                     else ("probability", "probability"))
    chose = [0, 0]
    for dual, verified, active, text, before, after in decoder.steps:
        assert dual.head_drafts is not None and dual.choice is not None and dual.expected_accepted is not None
        for row in range(len(PROMPTS)):
            if not active[row]:
                continue
            assert before.offers[row].tolist() == [list(r) + [0] * (16 - len(r)) if heads == "model,retrieval"
                                                   else list(r) for r in reference[row].offers]
            trees = (_row_tree(dual.head_drafts[0], row), _row_tree(dual.head_drafts[1], row))
            lengths = (_row_lengths(dual, 0, row), _row_lengths(dual, 1, row))
            for head, tree, row_lengths in zip(dual_drafter.heads, trees, lengths):
                assert (row_lengths is not None) == (head_feature(head) == "match-length")
                if row_lengths is not None:
                    _check_match_lengths(head, tree, row_lengths, text[row])
            want = ref_dual.calibrated_route(trees[0], trees[1], reference[row], lengths)
            assert int(dual.choice[row]) == want.head
            chose[want.head - 1] += 1
            np.testing.assert_allclose(dual.expected_accepted[row].numpy(), want.expected_accepted, rtol=1e-12)
            reference[row] = ref_dual.update_calibration(reference[row], trees[0], trees[1],
                                                         _block(dual, verified, row), lengths)
            for h in range(2):
                size = reference[row].num_classes(h + 1)
                assert after.offers[row, h, :size].tolist() == list(reference[row].offers[h])
                assert after.matches[row, h, :size].tolist() == list(reference[row].matches[h])
                assert int(after.offers[row, h, size:].sum()) == 0
        for row in range(len(PROMPTS)):  # rows that had stopped keep their counts
            if not active[row]:
                assert torch.equal(after.offers[row], before.offers[row])
    assert sum(sum(c) for r in reference for c in r.offers) > 0
    if heads == "model,retrieval":
        assert min(chose) > 0, chose  # both heads won some steps: the comparison covers both branches


def test_dual_drafter_features_and_the_committed_prior_tables() -> None:
    """A retrieval head is classed by match length, every other head by draft probability; a prior must be
    for its head's feature; the committed tables (scripts/route_prior.py) hold one per committed drafter."""
    model, retrieval = HEADS["model,retrieval"]()
    assert DualDrafter(model, retrieval, "route-calibrated").features == ("probability", "match-length")
    table = {name: load_route_prior(name) for name in ("rnn", "eagle", "retrieval")}
    assert table["rnn"] is not None and table["eagle"] is not None and table["retrieval"] is not None
    assert table["rnn"].feature == table["eagle"].feature == "probability"
    assert table["retrieval"].feature == "match-length" and len(table["retrieval"].rates) == 16
    assert load_route_prior("early-exit:24") is None
    start = DualDrafter(model, retrieval, "route-calibrated", (table["rnn"], table["retrieval"])).initial_calibration()
    assert start.prior == (table["rnn"].rates, table["retrieval"].rates) and start.offers == ((0,) * 10, (0,) * 16)
    with pytest.raises(ValueError, match="the second head is classed by 'match-length', got a table for 'probability'"):
        DualDrafter(model, retrieval, "route-calibrated", (None, table["rnn"]))


def test_committed_block_is_the_accepted_tokens_then_the_next_token() -> None:
    tokens = torch.tensor([[9, 4, 5, 6], [9, 7, 8, 1]])
    slots = torch.tensor([[0, 2, 3, -1], [0, -1, -1, -1]])
    got = committed_block(tokens, slots, torch.tensor([2, 0]), torch.tensor([11, 12]))
    assert got.tolist() == [[5, 6, 11, -1], [12, -1, -1, -1]]


class _ConfidentlyWrong(ModelDrafter):
    """Proposes, with draft probability exactly 1, the token after the model's own argmax: with the target
    as its model it is wrong at every greedy step."""

    def forward(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        logits = super().forward(state, tokens, parents)
        wrong = (logits.argmax(dim=-1, keepdim=True) + 1) % logits.shape[-1]
        return torch.full_like(logits, -1e4).scatter(-1, wrong, 0.0)


@pytest.mark.parametrize("strategy", ["chain:2", "topk:2,1,2"])
def test_the_calibration_leaves_a_confident_but_always_wrong_head(strategy: str) -> None:
    """Head 1: always wrong with q = 1 (mean confidence 1); head 2: the target itself (always right, q < 1).
    The seed's route verifies head 1 at every step; the calibrated route only at each row's first step
    (empty calibration: two full chains tie, ties to head 1), then head 2, which accepts whole chains."""
    results = {}
    for mode in ("route", "route-calibrated"):
        dual = DualDrafter(_ConfidentlyWrong(TARGET), ModelDrafter(TARGET), mode)
        results[mode] = SpeculativeDecoder(TARGET, dual, parse_strategy(strategy)).generate(
            PROMPTS, max_new_tokens=NEW_TOKENS)
        assert results[mode].tokens == AR
    raw, calibrated = results["route"].metrics, results["route-calibrated"].metrics
    assert raw.head_selected[1] == 0 and sum(raw.head_accepted_tokens) == 0
    assert calibrated.head_selected[0] == len(PROMPTS) and calibrated.head_accepted_tokens[0] == 0
    assert calibrated.head_selected[1] > raw.head_selected[0] / 4
    assert calibrated.head_accepted_tokens[1] >= calibrated.head_selected[1]  # right head's chains accepted
    state = results["route-calibrated"].state
    assert state is not None and state.proposal.calibration is not None
    # head 1 never matched, and kept being counted after its last verified step
    assert int(state.proposal.calibration.matches[:, 0].sum()) == 0
    assert int(state.proposal.calibration.offers[:, 0, -1].sum()) >= sum(calibrated.head_selected)


def test_the_calibration_is_per_call_and_not_shared_between_threads() -> None:
    """At T > 0 the routed head decides which uniforms verify which tree, so a calibration leaking from one
    call into another would change the tokens."""
    decoder = SpeculativeDecoder(TARGET, DualDrafter(ModelDrafter(DRAFT_MODEL), HEADS["model,retrieval"]()[1],
                                                     "route-calibrated"), parse_strategy("chain:2"))
    prompts = (PROMPTS, PROMPTS[::-1])
    sampling = [SamplingParams(temperature=0.9, seed=s) for s in (3, 4)]
    alone = [decoder.generate(p, max_new_tokens=NEW_TOKENS, sampling=s) for p, s in zip(prompts, sampling)]
    again = decoder.generate(prompts[0], max_new_tokens=NEW_TOKENS, sampling=sampling[0])
    assert again.tokens == alone[0].tokens and again.metrics.head_selected == alone[0].metrics.head_selected
    assert again.state is not None and alone[0].state is not None
    assert again.state.proposal.calibration is not None and alone[0].state.proposal.calibration is not None
    assert torch.equal(again.state.proposal.calibration.offers, alone[0].state.proposal.calibration.offers)
    def call(i: int) -> Any:
        out = decoder.generate(prompts[i], max_new_tokens=NEW_TOKENS, sampling=sampling[i])
        return out.tokens, out.metrics.head_selected

    together = run_in_two_threads(call)
    for i in range(2):
        assert together[i] == [(alone[i].tokens, alone[i].metrics.head_selected)] * 2


def test_dual_modes_agree_between_settings_and_the_drafter_and_the_cli_lists_route_calibrated(
        capsys: pytest.CaptureFixture[str]) -> None:
    from spec_fast.cli import main
    from spec_fast.settings import DUAL_MODES as SETTINGS_DUAL_MODES

    assert SETTINGS_DUAL_MODES == DUAL_MODES and "route-calibrated" in DUAL_MODES
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--help"])
    assert exit_info.value.code == 0
    assert "route-calibrated" in capsys.readouterr().out
    with pytest.raises(ValueError, match="mode must be one of"):
        DualDrafter(EarlyExitDrafter(TARGET, 1), EarlyExitDrafter(TARGET, 1), "route_calibrated")
