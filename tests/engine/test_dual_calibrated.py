"""Calibrated routing in the engine (``DualDrafter(..., mode="route-calibrated")``, docs/algorithms.md
section 8): greedy output equals AR; on recorded steps the engine's route choice, expected accepted lengths
and calibration counts equal :func:`spec_ref.dual.calibrated_route` / :func:`spec_ref.dual.update_calibration`
run alongside (greedy and T > 0); the calibration is per call (fresh calls and threads sharing a decoder);
and a pair where one head proposes with probability 1 but is always wrong: the seed's route keeps verifying
it, the calibrated route leaves it after the first step. Tiny random models, seconds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from spec_fast import DualDrafter
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.dual import DUAL_MODES, RouteCalibration, committed_block
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
    """Records every step's routed draft, verification, active rows and calibration before and after."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.steps: list[tuple[Any, Any, list[bool], RouteCalibration, RouteCalibration]] = []

    def _commit_phase(self, st: DecodeState, draft: Any, dual: Any, verified: Any, *rest: Any) -> Any:
        before, active = st.route_calibration, list(st.active)
        out = super()._commit_phase(st, draft, dual, verified, *rest)
        if dual is not None:
            assert before is not None and st.route_calibration is not None
            self.steps.append((dual, verified, active, before, st.route_calibration))
        return out


def _block(dual: Any, verified: Any, row: int) -> list[int]:
    """Host-side: the tokens committed after the root in ``row`` (accepted draft tokens, then the next)."""
    slots = [int(s) for s in verified.accepted_slots[row].tolist() if s >= 0][1:]
    return [int(dual.batch.tree.tokens[row, s]) for s in slots] + [int(verified.next_token[row])]


@pytest.mark.parametrize("heads,strategy", [("model,retrieval", "topk:3,2,5"), ("early-exit,model", "chain:3"),
                                            ("model,retrieval", "chain:2")])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_route_choice_and_calibration_counts_equal_spec_ref_on_recorded_steps(
        heads: str, strategy: str, temperature: float) -> None:
    first, second = HEADS[heads]()
    decoder = _Recorder(TARGET, DualDrafter(first, second, "route-calibrated"), parse_strategy(strategy))
    decoder.generate(PROMPTS, max_new_tokens=NEW_TOKENS, sampling=SamplingParams(temperature=temperature, seed=7))
    assert len(decoder.steps) >= 4
    reference = [ref_dual.RouteCalibration() for _ in PROMPTS]
    chose = [0, 0]
    for dual, verified, active, before, after in decoder.steps:
        assert dual.head_drafts is not None and dual.choice is not None and dual.expected_accepted is not None
        for row in range(len(PROMPTS)):
            if not active[row]:
                continue
            assert before.offers[row].tolist() == [list(r) for r in reference[row].offers]
            tree_a, tree_b = _row_tree(dual.head_drafts[0], row), _row_tree(dual.head_drafts[1], row)
            want = ref_dual.calibrated_route(tree_a, tree_b, reference[row])
            assert int(dual.choice[row]) == want.head
            chose[want.head - 1] += 1
            np.testing.assert_allclose(dual.expected_accepted[row].numpy(), want.expected_accepted, rtol=1e-12)
            reference[row] = ref_dual.update_calibration(reference[row], tree_a, tree_b, _block(dual, verified, row))
            assert after.offers[row].tolist() == [list(r) for r in reference[row].offers]
            assert after.matches[row].tolist() == [list(r) for r in reference[row].matches]
        for row in range(len(PROMPTS)):  # rows that had stopped keep their counts
            if not active[row]:
                assert torch.equal(after.offers[row], before.offers[row])
    assert sum(sum(c) for r in reference for c in r.offers) > 0
    if heads == "model,retrieval":
        assert min(chose) > 0, chose  # both heads won some steps: the comparison covers both branches


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
    assert state is not None and state.route_calibration is not None
    # head 1 never matched, and kept being counted after its last verified step
    assert int(state.route_calibration.matches[:, 0].sum()) == 0
    assert int(state.route_calibration.offers[:, 0, -1].sum()) >= sum(calibrated.head_selected)


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
    assert again.state.route_calibration is not None and alone[0].state.route_calibration is not None
    assert torch.equal(again.state.route_calibration.offers, alone[0].state.route_calibration.offers)
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
