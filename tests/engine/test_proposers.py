"""The proposer registry and the proposer hooks (docs/engine.md section 11): every strategy maps to its
proposer, the engine calls the hooks in step order, and a proposer's per-request rows follow the batch when
requests leave and join."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from spec_fast.decoding import SamplingParams
from spec_fast.drafts.chain import ChainProposer
from spec_fast.drafts.delayed import DelayedProposer
from spec_fast.drafts.dual import DualDrafter
from spec_fast.drafts.dual_calibration import RouteCalibration
from spec_fast.drafts.dual_drafting import DualProposer, RouteRows
from spec_fast.drafts.dynatree import DynaTreeProposer, DynaTreeRows
from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.drafts.proposer import NO_ROWS, PlainProposer, Proposer
from spec_fast.drafts.topk import TopKProposer
from spec_fast.engine import SpeculativeDecoder
from spec_fast.engine.proposers import PROPOSERS, make_proposer
from spec_fast.nde.proposer import NdeRows
from spec_fast.strategies import SAMPLING_VERIFIERS, parse_strategy
from spec_ref.dynatree import DynaTreeHistory
from tests.engine.models import tiny_llama

TARGET = tiny_llama(vocab_size=16, seed=3)
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]


def _drafter() -> EarlyExitDrafter:
    return EarlyExitDrafter(TARGET, 2)


@pytest.mark.parametrize("spec,kind,most_draws", [
    ("ar", PlainProposer, 1), ("chain:3", ChainProposer, 1), ("iid:2x3", DelayedProposer, 2),
    ("delayed:4,1,2", DelayedProposer, 4), ("topk:3,2,5", TopKProposer, 2), ("dynatree", DynaTreeProposer, 1),
])
def test_each_strategy_maps_to_its_proposer(spec: str, kind: type, most_draws: int) -> None:
    proposer = make_proposer(parse_strategy(spec), TARGET, _drafter())
    assert type(proposer) is kind
    # the verifier's uniforms per node, and whether greedy drafting follows the argmax (a chain only)
    assert proposer.most_draws == most_draws
    assert proposer.greedy_argmax == (kind is ChainProposer)


def test_every_shape_has_exactly_one_registry_entry_and_a_dual_drafter_gets_the_dual_proposer() -> None:
    assert set(PROPOSERS) == set(SAMPLING_VERIFIERS)
    dual = DualDrafter(_drafter(), EarlyExitDrafter(TARGET, 1), "merge")
    assert type(make_proposer(parse_strategy("chain:2"), TARGET, dual)) is DualProposer
    with pytest.raises(ValueError, match="dual draft needs a deterministic 'chain' or 'topk'"):
        make_proposer(parse_strategy("iid:2x2"), TARGET, dual)


class _Recording:
    """Delegates to a proposer and records the hooks the engine calls, in order."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.reads_target_hidden = inner.reads_target_hidden
        self.reads_previous = inner.reads_previous

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if not callable(attribute):
            return attribute

        def hook(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attribute(*args, **kwargs)

        return hook


@pytest.mark.parametrize("spec", ["chain:3", "dynatree:2,4,10", "topk:3,2,5"])
def test_the_engine_calls_the_hooks_in_step_order_and_a_wrapped_proposer_changes_nothing(spec: str) -> None:
    plain = SpeculativeDecoder(TARGET, _drafter(), parse_strategy(spec)).generate(PROMPTS, max_new_tokens=9)
    decoder = SpeculativeDecoder(TARGET, _drafter(), parse_strategy(spec))
    recording = _Recording(decoder.proposer)
    decoder.proposer = recording  # type: ignore[assignment]
    result = decoder.generate(PROMPTS, max_new_tokens=9)
    assert result.tokens == plain.tokens
    calls = [c for c in recording.calls if c != "compatible"]  # admission asks once per request
    assert recording.calls.count("compatible") == len(PROMPTS)
    assert calls[:2] == ["drafters", "begin"]
    steps = calls[2:]
    # a step: gate_caps and draft (unless it is a plain step; gate_caps alone where it made every row's cap 0),
    # then after_verify, then after_commit
    text = (" ".join(steps).replace("gate_caps draft after_verify after_commit", "S")
            .replace("gate_caps after_verify after_commit", "P").replace("after_verify after_commit", "P"))
    assert set(text.split()) <= {"S", "P"} and "S" in text.split(), steps
    assert result.state is not None
    assert isinstance(result.state.proposal, DynaTreeRows) == spec.startswith("dynatree")


def _history(acceptance: Sequence[int]) -> DynaTreeHistory:
    return DynaTreeHistory(window=4, acceptance=tuple(acceptance))


def test_dynatree_rows_follow_the_batch() -> None:
    rows = DynaTreeRows([_history([0.1]), _history([0.2]), _history([0.3])])
    kept = rows.take_rows([2, 0])
    assert [h.acceptance for h in kept.history] == [(0.3,), (0.1,)]
    joined = kept.join(DynaTreeRows([_history([0.4])]))
    assert [h.acceptance for h in joined.history] == [(0.3,), (0.1,), (0.4,)]
    assert [h.acceptance for h in rows.history] == [(0.1,), (0.2,), (0.3,)]  # the old state is unchanged


def test_route_rows_follow_the_batch_row_by_row() -> None:
    calibration = RouteCalibration.start(3, torch.device("cpu"))
    offers = torch.arange(calibration.offers.numel()).reshape(calibration.offers.shape)
    rows = RouteRows(RouteCalibration(calibration.edges, offers, offers * 10, calibration.prior,
                                      calibration.features))
    kept = rows.take_rows([1])
    assert kept.calibration is not None and torch.equal(kept.calibration.offers, offers[1:2])
    joined = kept.join(rows)
    assert joined.calibration is not None
    assert torch.equal(joined.calibration.offers, torch.cat([offers[1:2], offers]))
    assert torch.equal(joined.calibration.matches, torch.cat([offers[1:2], offers]) * 10)
    assert RouteRows(None).take_rows([0]).calibration is None


def test_nde_rows_keep_their_rows_and_refuse_to_join() -> None:
    logits, hidden = torch.arange(6.0).reshape(3, 2), torch.arange(9.0).reshape(3, 3)
    kept = NdeRows((logits, hidden)).take_rows([2, 1])
    assert kept.previous is not None
    assert torch.equal(kept.previous[0], logits[[2, 1]]) and torch.equal(kept.previous[1], hidden[[2, 1]])
    with pytest.raises(ValueError, match="static batches"):
        kept.join(NdeRows(None))


def test_stateless_proposers_share_one_empty_row_state() -> None:
    proposer = make_proposer(parse_strategy("chain:2"), TARGET, _drafter())
    assert proposer.begin(2, torch.device("cpu"), None) is NO_ROWS
    assert NO_ROWS.take_rows([0]) is NO_ROWS and NO_ROWS.join(NO_ROWS) is NO_ROWS


def test_admission_follows_the_proposer() -> None:
    greedy, sampled = SamplingParams(), SamplingParams(temperature=0.8, seed=1)
    chain = make_proposer(parse_strategy("chain:2"), TARGET, _drafter())
    assert chain.compatible(sampled, [greedy], [greedy])
    dual = make_proposer(parse_strategy("chain:2"), TARGET, DualDrafter(_drafter(), EarlyExitDrafter(TARGET, 1),
                                                                        "route"))
    assert dual.compatible(greedy, [greedy], []) and not dual.compatible(sampled, [greedy], [])
