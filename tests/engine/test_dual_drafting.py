"""The engine's dual drafting (:mod:`spec_fast.drafts.dual_drafting`): a head's device-side top-1 chain equals
:func:`spec_fast.drafts.topk.draft_topk_tree` with ``k = 1`` field for field, and routing that stops a head which
cannot win makes every choice, every calibration count and (greedy and sampled) every token that routing the
full drafts makes. Tiny random models, seconds."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from spec_fast import DualDrafter
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.topk import draft_topk_tree
from spec_fast.drafts import dual_drafting
from spec_fast.drafts.dual import RoutePrior
from spec_fast.drafts.dual_drafting import TopChain
from spec_fast.drafts.model import EarlyExitDrafter, ModelDrafter
from spec_fast.engine import DecodeState, SpeculativeDecoder
from spec_fast.engine.prefill import prefill_drafter
from spec_fast.strategies import parse_strategy
from spec_ref.dual_calibration import num_classes
from tests.engine.test_dual import AR, DRAFT_MODEL, NEW_TOKENS, PROMPTS, RETRIEVAL, TARGET

CPU = torch.device("cpu")


@pytest.mark.parametrize("head", ["model", "early-exit", "retrieval"])
@pytest.mark.parametrize("depth", [1, 3])
def test_top_chain_equals_topk_tree_with_one_child(head: str, depth: int) -> None:
    drafter: Any = {"model": ModelDrafter(DRAFT_MODEL), "early-exit": EarlyExitDrafter(TARGET, 1),
                    "retrieval": RETRIEVAL}[head]
    drafts = []
    for build in ("chain", "topk"):
        state = drafter.begin(len(PROMPTS), CPU)
        prefill_drafter(drafter, state, PROMPTS, CPU)
        pending, roots = [[p[-1]] for p in PROMPTS], [p[-1] for p in PROMPTS]
        with torch.no_grad():
            if build == "chain":
                chain = TopChain.start(drafter, state, pending, depth, CPU)
                chain.finish()
                drafts.append(chain.batch(roots))
            else:
                drafts.append(draft_topk_tree(drafter, state, pending, roots, depth, 1, depth, CPU))
    got, want = drafts
    for name in ("tokens", "parents", "depths", "draws", "valid"):
        assert torch.equal(getattr(got.tree, name), getattr(want.tree, name)), name
    assert got.tree.process == want.tree.process == "deterministic"
    assert torch.equal(got.confidences, want.confidences)  # bit for bit: the route compares them
    assert torch.equal(got.entries, want.entries) and torch.equal(got.tokens_in, want.tokens_in)
    assert (got.pending_width, got.max_depth) == (want.pending_width, want.max_depth)


class _Recorder(SpeculativeDecoder):
    """Records every step's route choice and calibration, and how many heads stopped early."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.choices: list[list[int]] = []
        self.stopped = 0
        self.skipped = 0

    def _commit_phase(self, st: DecodeState, draft: Any, dual: Any, *rest: Any) -> Any:
        if dual is not None and dual.choice is not None:
            self.choices.append(dual.choice.tolist())
            self.stopped += sum(c is not None for c in dual.stopped)  # those finished for the counts not included
            self.skipped += sum(dual.skipped)
        return super()._commit_phase(st, draft, dual, *rest)


def _run(mode: str, layers: int, strategy: str, temperature: float, stop: bool, monkeypatch: pytest.MonkeyPatch
         ) -> tuple[_Recorder, list[Any], int]:
    """One call per prompt (a head stops only where it loses on every row); head 1 is the target's first
    ``layers`` layers (0: the target itself, whose greedy chain is the committed text, so a stopped chain
    often has to be finished for the calibration). Returns the decoder, the results and how many stopped chains were finished later."""
    finished = [0]
    with monkeypatch.context() as patch:
        if not stop:  # every head drafts its whole chain, as without the bound
            patch.setattr(dual_drafting, "_cannot_win", lambda *args: False)
        original = dual_drafting.TopChain.finish

        def counted_finish(chain: TopChain) -> None:
            finished[0] += not chain.done
            original(chain)

        patch.setattr(dual_drafting.TopChain, "finish", counted_finish)
        head = ModelDrafter(TARGET) if layers == 0 else EarlyExitDrafter(TARGET, layers)
        # the target as head 1 would win every calibrated route; priors that trust it little make it lose
        # (and stop) while its chain is the committed text
        priors = (RoutePrior("probability", (0.02,) * num_classes("probability")),
                  RoutePrior("match-length", (0.98,) * num_classes("match-length"))) if layers == 0 else (None, None)
        dual = DualDrafter(head, RETRIEVAL, mode, priors)
        decoder = _Recorder(TARGET, dual, parse_strategy(strategy))
        results = [decoder.generate([prompt], max_new_tokens=NEW_TOKENS,
                                    sampling=SamplingParams(temperature=temperature, seed=4)) for prompt in PROMPTS]
    return decoder, results, finished[0]


@pytest.mark.parametrize("mode", ["route", "route-calibrated"])
@pytest.mark.parametrize("strategy", ["chain:2", "chain:3"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("layers", [1, 0])
def test_stopping_a_head_that_cannot_win_changes_no_choice_count_or_token(
        mode: str, strategy: str, temperature: float, layers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    (fast, fast_results, finished), (full, full_results, _) = (
        _run(mode, layers, strategy, temperature, stop, monkeypatch) for stop in (True, False))
    assert fast.stopped > 0 and full.stopped == 0  # the bound did stop a head
    assert fast.choices == full.choices
    assert [r.tokens[0] for r in fast_results] == [r.tokens[0] for r in full_results]
    if temperature == 0.0:
        assert [r.tokens[0] for r in fast_results] == AR
    for fast_result, full_result in zip(fast_results, full_results):
        fast_state, full_state = fast_result.state, full_result.state
        assert fast_state is not None and full_state is not None
        if mode == "route-calibrated":
            assert fast_state.proposal.calibration is not None and full_state.proposal.calibration is not None
            assert torch.equal(fast_state.proposal.calibration.offers, full_state.proposal.calibration.offers)
            assert torch.equal(fast_state.proposal.calibration.matches, full_state.proposal.calibration.matches)
    # what stopping saves: draft passes (less those the calibration's counts needed after all)
    saved = sum(r.metrics.draft_passes for r in full_results) - sum(r.metrics.draft_passes for r in fast_results)
    assert saved > 0
    if mode == "route-calibrated" and layers == 0 and temperature == 0.0:
        assert finished > 0  # the counts needed a stopped chain's next node: it was drafted before the commit
    print(f"{mode} {strategy} T={temperature} layers={layers}: {fast.stopped} heads stopped, {finished} finished later, "
          f"{saved} draft passes saved")


@pytest.mark.parametrize("strategy", ["chain:2", "chain:3"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_model_head_behind_a_certain_retrieval_head_is_not_drafted_and_changes_nothing(
        strategy: str, temperature: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retrieval as head 1: on a step where its chain scores exactly 1 (one follower at every level), head 2
    cannot win the tie, so it drafts nothing and catches up through its pending tokens on a later step.
    Choices and tokens equal those of routing both full drafts; the skipped passes are saved."""
    runs = []
    for stop in (True, False):
        with monkeypatch.context() as patch:
            if not stop:
                patch.setattr(dual_drafting, "_cannot_win", lambda *args: False)
            decoder = _Recorder(TARGET, DualDrafter(RETRIEVAL, EarlyExitDrafter(TARGET, 1), "route"),
                                parse_strategy(strategy))
            results = [decoder.generate([prompt], max_new_tokens=NEW_TOKENS,
                                        sampling=SamplingParams(temperature=temperature, seed=4)) for prompt in PROMPTS]
        runs.append((decoder, results))
    (fast, fast_results), (full, full_results) = runs
    assert fast.skipped > 0 and full.skipped == 0
    assert fast.choices == full.choices
    assert [r.tokens[0] for r in fast_results] == [r.tokens[0] for r in full_results]
    if temperature == 0.0:
        assert [r.tokens[0] for r in fast_results] == AR
    saved = sum(r.metrics.draft_passes for r in full_results) - sum(r.metrics.draft_passes for r in fast_results)
    assert saved >= fast.skipped  # at least the first pass of every skipped head
