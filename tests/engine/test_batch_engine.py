"""BatchEngine: requests that join and leave a running batch.

A request's output does not depend on what else shares its batch: greedy output equals the request run
alone (and plain decoding), and under a fixed strategy so does seeded sampled output, token for token,
with requests joining at random steps, neighbours aborted mid-way, and mixed sampling parameters and
lengths. The negative control draws every row from one batch-wide stream (what the engine did before it
kept one stream per request): the same comparison must then fail.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from spec_fast.engine.batch_engine import BatchEngine, QueueFullError, RequestOutput
from spec_fast.engine.decode_state import DecodeState
from spec_fast.decoding import SamplingParams
from spec_fast.draws import STEP_STRIDE, RowStreams
from spec_fast.drafts.dual import DualDrafter
from spec_fast.drafts.model import Drafter, EarlyExitDrafter, ModelDrafter
from spec_fast.drafts.retrieval import RetrievalDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.lean import LeanLlama
from spec_fast.strategies import parse_strategy
from tests.engine.models import tiny_llama

TARGET = tiny_llama(vocab_size=48, seed=7)
LEAN = LeanLlama.from_hf(TARGET, "float32")
PROMPT_RNG = random.Random(1)
PROMPTS = [[PROMPT_RNG.randrange(48) for _ in range(PROMPT_RNG.randint(1, 9))] for _ in range(5)]


@dataclass(frozen=True)
class Arrival:
    prompt: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    step: int  # the engine step before which it is added
    abort_at: int | None = None  # the engine step before which it is aborted


def schedule(seed: int, sampled: bool, greedy: bool) -> list[Arrival]:
    """Five requests arriving at random steps with mixed parameters and lengths; one is aborted mid-way."""
    rng = random.Random(seed)
    kinds = [SamplingParams(temperature=0.0)] * greedy + [
        SamplingParams(temperature=0.8, seed=11), SamplingParams(temperature=1.0, top_k=8, seed=12),
        SamplingParams(temperature=1.2, top_p=0.9, seed=13)] * sampled
    arrivals = []
    for i, prompt in enumerate(PROMPTS):
        arrivals.append(Arrival(prompt, kinds[i % len(kinds)], rng.randint(3, 10), rng.randint(0, 5),
                                abort_at=4 if i == 2 else None))
    return arrivals


def run(decoder: SpeculativeDecoder, arrivals: list[Arrival], max_batch_size: int = 3, depth_policy: str = "fixed"
        ) -> tuple[dict[int, list[int]], dict[int, str], int]:
    """Drive an engine through ``arrivals``; returns each request's tokens and finish reason (by arrival
    index) and the largest number of requests that ran together."""
    engine = BatchEngine(decoder, max_batch_size=max_batch_size, depth_policy=depth_policy)
    ids: dict[int, int] = {}
    tokens: dict[int, list[int]] = {}
    reasons: dict[int, str] = {}
    step, most = 0, 0
    while step <= max(a.step for a in arrivals) or engine.has_unfinished():
        for i, arrival in enumerate(arrivals):
            if arrival.step == step:
                ids[i] = engine.add_request(arrival.prompt, arrival.sampling, arrival.max_new_tokens)
                tokens[i] = []
            if arrival.abort_at == step and i in ids:
                engine.abort(ids[i])
        outputs = engine.step()
        most = max(most, engine.num_running + sum(1 for o in outputs if o.finished and o.finish_reason != "abort"))
        by_id = {rid: i for i, rid in ids.items()}
        for out in outputs:
            tokens[by_id[out.request_id]].extend(out.new_tokens)
            if out.finished:
                reasons[by_id[out.request_id]] = str(out.finish_reason)
        step += 1
    return tokens, reasons, most


def alone(decoder: SpeculativeDecoder, arrival: Arrival) -> list[int]:
    out = run(decoder, [Arrival(arrival.prompt, arrival.sampling, arrival.max_new_tokens, 0)], max_batch_size=1)
    return out[0][0]


def decoder_for(strategy: str, target: Any = TARGET, drafter: Drafter | None = None) -> SpeculativeDecoder:
    st = parse_strategy(strategy)
    if drafter is None and st.drafts:
        drafter = EarlyExitDrafter(target, 2)
    return SpeculativeDecoder(target, drafter, st)


def assert_each_request_as_alone(decoder: SpeculativeDecoder, arrivals: list[Arrival]) -> None:
    tokens, reasons, most = run(decoder, arrivals)
    assert most >= 2  # requests did share the batch
    for i, arrival in enumerate(arrivals):
        solo = alone(decoder, arrival)
        if arrival.abort_at is not None and reasons[i] == "abort":
            assert tokens[i] == solo[: len(tokens[i])]
        else:
            assert tokens[i] == solo, (i, arrival)
            assert reasons[i] == "length"


@pytest.mark.parametrize("strategy", ["ar", "chain:3", "iid:2x2", "delayed:2,1,2", "topk:3,2,6", "dynatree"])
def test_a_request_decodes_as_alone_whatever_joins_leaves_or_samples_beside_it(strategy: str) -> None:
    st = parse_strategy(strategy)
    # greedy-only verifiers (dynatree) take greedy requests; every other strategy mixes greedy and sampled
    arrivals = schedule(seed=len(strategy), sampled=st.verifier not in ("greedy", "dynatree"), greedy=True)
    assert_each_request_as_alone(decoder_for(strategy), arrivals)


@pytest.mark.parametrize("mode", ["merge", "route"])
def test_dual_drafts_decode_each_greedy_request_as_alone(mode: str) -> None:
    dual = DualDrafter(EarlyExitDrafter(TARGET, 1), RetrievalDrafter(None, 48), mode)
    assert_each_request_as_alone(decoder_for("chain:3", drafter=dual), schedule(seed=5, sampled=False, greedy=True))


def test_the_lean_target_and_a_model_draft_decode_each_request_as_alone() -> None:
    draft = ModelDrafter(LeanLlama.from_hf(tiny_llama(vocab_size=48, layers=2, seed=8), "float32"))
    assert_each_request_as_alone(decoder_for("iid:2x3", target=LEAN, drafter=draft),
                                 schedule(seed=2, sampled=True, greedy=True))


def test_the_rnn_head_behind_retrieval_decodes_each_request_as_alone() -> None:
    """Rows of a recurrent head (its block counter, features, path rule's probabilities, prompts taken without a
    pass) join and leave a running batch, greedy and sampled, each decoding as it does alone."""
    from spec_fast.drafts.heads import FeatureHead, HeadDrafter
    from spec_fast.drafts.hybrid import HybridDrafter

    torch.manual_seed(3)
    head = FeatureHead(TARGET, "rnn", torch.arange(0, 48, 2)).eval()
    for p in head.parameters():
        p.requires_grad_(False)
    head.use_native(True)
    drafter = HybridDrafter(RetrievalDrafter(None, 48), HeadDrafter(head, path_acceptance=0.05), 2)
    assert_each_request_as_alone(decoder_for("chain:3", target=LEAN, drafter=drafter),
                                 schedule(seed=4, sampled=True, greedy=True))


def _one_batch_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: every row draws from row 0's keys at counters set by the batch's step and the row's place in
    it (one stream for the batch, as a single generator per batch gives)."""
    def offsets(st: DecodeState) -> torch.Tensor:
        rows = torch.arange(st.batch_size, device=st.row_steps.device)
        return st.steps * STEP_STRIDE + rows * (1 << 30)

    monkeypatch.setattr(DecodeState, "draft_streams",
                        lambda st: RowStreams(st.draft_keys[:1].expand(st.batch_size), offsets(st)))
    monkeypatch.setattr(DecodeState, "verify_offsets", offsets)
    original_keys = DecodeState.__init__

    def shared_keys(self: DecodeState, *args: Any, **kwargs: Any) -> None:
        original_keys(self, *args, **kwargs)
        self.verify_keys = self.verify_keys[:1].expand(self.batch_size).clone()

    monkeypatch.setattr(DecodeState, "__init__", shared_keys)


def test_negative_control_one_stream_shared_by_the_batch_makes_sampled_requests_depend_on_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = decoder_for("chain:3")
    arrivals = schedule(seed=3, sampled=True, greedy=False)
    _one_batch_stream(monkeypatch)
    with pytest.raises(AssertionError):
        assert_each_request_as_alone(decoder, arrivals)


def test_requests_beyond_the_batch_wait_and_a_finished_or_aborted_one_frees_its_slot_at_once() -> None:
    engine = BatchEngine(decoder_for("chain:3"), max_batch_size=2, max_waiting=3, depth_policy="fixed")
    ids = [engine.add_request(p, SamplingParams(), 6) for p in PROMPTS[:3]]
    with pytest.raises(QueueFullError):
        engine.add_request(PROMPTS[4], SamplingParams(), 6)
    assert isinstance(QueueFullError("x"), RuntimeError)
    engine.step()
    ids.append(engine.add_request(PROMPTS[3], SamplingParams(), 6))
    assert (engine.num_running, engine.num_waiting) == (2, 2)
    assert engine.abort(ids[0]) and not engine.abort(ids[0])
    assert engine.num_running == 1 and engine.state is not None and engine.state.batch_size == 1
    outputs = engine.step()  # the abort's output comes first; a waiting request took the free slot
    assert outputs[0] == RequestOutput(ids[0], [], True, "abort", None, outputs[0].stats)
    assert engine.num_running == 2 and engine.num_waiting == 1
    assert engine.abort(ids[3])  # a waiting request can be aborted too
    finished: list[RequestOutput] = []
    while engine.has_unfinished():
        finished.extend(o for o in engine.step() if o.finished)
    assert {o.request_id: o.finish_reason for o in finished} == {ids[3]: "abort", ids[1]: "length", ids[2]: "length"}
    assert engine.state is None  # every cache row freed
    stats = next(o.stats for o in finished if o.request_id == ids[1])
    assert stats.generated_tokens == 6 and stats.prompt_tokens == len(PROMPTS[1])
    assert sum(stats.accepted_length_histogram) == stats.target_passes
    assert stats.accepted_tokens + stats.target_passes >= stats.generated_tokens  # the last step may be cut
    assert stats.ttft_s > 0 and stats.mean_accepted_length == stats.accepted_tokens / stats.target_passes


def test_an_output_keeps_the_stats_of_its_step_while_later_steps_update_the_request() -> None:
    engine = BatchEngine(decoder_for("chain:3"), max_batch_size=1, depth_policy="fixed")
    engine.add_request(PROMPTS[1], SamplingParams(), 8)
    outputs = [o for _ in range(3) for o in engine.step()]
    first = outputs[0].stats
    seen = (first.generated_tokens, first.target_passes, list(first.accepted_length_histogram),
            list(first.accepted_per_position))
    while engine.has_unfinished():
        outputs.extend(engine.step())
    assert outputs[-1].stats.target_passes > first.target_passes  # the request went on
    assert (first.generated_tokens, first.target_passes, first.accepted_length_histogram,
            first.accepted_per_position) == seen


def test_eos_ends_a_request_with_finish_reason_stop() -> None:
    decoder = decoder_for("chain:3")
    solo = alone(decoder, Arrival(PROMPTS[0], SamplingParams(), 10, 0))
    engine = BatchEngine(decoder, eos_token_id=solo[3])
    rid = engine.add_request(PROMPTS[0], SamplingParams(), 10)
    outputs = []
    while engine.has_unfinished():
        outputs.extend(engine.step())
    assert [t for o in outputs for t in o.new_tokens] == solo[: solo.index(solo[3]) + 1]
    assert outputs[-1].request_id == rid and outputs[-1].finish_reason == "stop"


@pytest.mark.parametrize("bad,match", [
    (dict(prompt_ids=[]), "prompt_ids is empty"),
    (dict(prompt_ids=[1, 99]), "prompt_ids has token ids outside"),
    (dict(prompt_ids="hello"), "prompt_ids"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=200), "exceeds the model context"),
    (dict(sampling=0.5), "sampling must be a SamplingParams"),
    (dict(stop=["x"]), "stop strings need a tokenizer"),
    (dict(stop=[""]), "stop must be"),
])
def test_bad_requests_are_refused_with_one_line_naming_the_argument(bad: dict[str, Any], match: str) -> None:
    engine = BatchEngine(decoder_for("chain:3"))
    args: dict[str, Any] = dict(prompt_ids=[1, 2], sampling=SamplingParams(), max_new_tokens=4, stop=())
    args.update(bad)
    with pytest.raises(ValueError, match=match) as error:
        engine.add_request(**args)
    assert "\n" not in str(error.value)


def test_a_drafter_without_row_operations_is_refused_for_a_running_batch() -> None:
    class Fixed(Drafter):
        vocab_size = 48

    with pytest.raises(ValueError, match="cannot change the rows"):
        BatchEngine(decoder_for("chain:3", drafter=Fixed()), max_batch_size=2)
    BatchEngine(decoder_for("chain:3", drafter=Fixed()), max_batch_size=1)  # one at a time needs none


def test_stop_strings_cut_the_text_and_tokens_and_running_texts_only_grow(tiny_chat_model_dir: str) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model_dir)
    model = LlamaForCausalLM.from_pretrained(tiny_chat_model_dir).eval()
    decoder = SpeculativeDecoder(model, EarlyExitDrafter(model, 2), parse_strategy("chain:3"))
    prompt = tokenizer("<user>hi\n<assistant>")["input_ids"]

    def drive(stop: tuple[str, ...], other: bool) -> tuple[list[RequestOutput], list[RequestOutput]]:
        engine = BatchEngine(decoder, max_batch_size=2, tokenizer=tokenizer)
        rid = engine.add_request(prompt, SamplingParams(), 16, stop=stop)
        if other:  # a neighbour without stop strings
            engine.add_request(prompt[:-2], SamplingParams(temperature=1.0, seed=4), 16)
        mine, theirs = [], []
        while engine.has_unfinished():
            for out in engine.step():
                (mine if out.request_id == rid else theirs).append(out)
        return mine, theirs

    full, _ = drive((), False)
    text = str(full[-1].text)
    tokens = [t for o in full for t in o.new_tokens]
    assert text == tokenizer.decode(tokens, skip_special_tokens=True) and full[-1].finish_reason == "length"
    stop = text[5:7]
    cut = text.index(stop)
    stopped, neighbour = drive(("zzz", stop), True)
    assert stopped[-1].finished and stopped[-1].finish_reason == "stop" and stopped[-1].text == text[:cut]
    got = [t for o in stopped for t in o.new_tokens]
    assert got == tokens[: len(got)] and stop in tokenizer.decode(got) and stop not in tokenizer.decode(got[:-1])
    assert stopped[-1].stats.generated_tokens == len(got)
    texts = [str(o.text) for o in stopped]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))
    assert neighbour[-1].finish_reason == "length" and neighbour[-1].stats.generated_tokens == 16


def test_the_cost_policy_picks_deep_trees_when_passes_are_cheap_and_none_when_the_batch_fills_them() -> None:
    from spec_fast.engine.batch_depth import PassCost, choose_depth

    # alone, a pass over 4 tokens costs 1.3x one over 1; with 8 rows every token costs its full share
    cost = PassCost({(r, t): (1.0 + 0.1 * (t - 1)) if r == 1 else float(t) for r in (1, 8) for t in (1, 2, 3, 4)})
    reached, accepted = [100, 80, 60], [80, 60, 40]  # acceptance 0.8, 0.75, 0.67
    assert choose_depth(cost, 1, 3, reached, accepted) == 3
    assert choose_depth(cost, 8, 3, reached, accepted) == 0
    assert choose_depth(cost, 1, 3, [100], [0]) == 0  # nothing accepted at depth 1: plain steps
    assert cost(4, 2) == cost(8, 2) and cost(16, 9) == 2 * cost(8, 4)
    # a depth must promise DRAFT_MARGIN over plain steps: depth 1 at 1.3x a plain step pays with acceptance
    # a when (1 + a) / 1.3 > 1 + DRAFT_MARGIN, so not at a = 0.4 (1.077) and at a = 0.5 (1.154)
    from spec_fast.engine.batch_depth import DRAFT_MARGIN, PRIOR_WEIGHT

    assert DRAFT_MARGIN == 0.1
    shallow = PassCost({(1, 1): 1.0, (1, 2): 1.3})
    many = 10_000  # enough steps that the prior no longer counts
    assert choose_depth(shallow, 1, 1, [many], [int(0.4 * many)]) == 0
    assert choose_depth(shallow, 1, 1, [many], [int(0.5 * many)]) == 1
    assert PRIOR_WEIGHT < many / 100


def test_a_depth_the_policy_stopped_drafting_is_tried_again_as_its_evidence_fades() -> None:
    from spec_fast.engine.batch_depth import EVIDENCE_DECAY, DepthEvidence, PassCost, choose_depth

    cost = PassCost({(1, 1): 1.0, (1, 2): 1.165})
    evidence = DepthEvidence()
    for step in range(14):  # 3 of 14 early drafts accepted: below what depth 1 needs here
        evidence.record(0, 1, 1 if step < 3 else 0)
    assert (evidence.reached, evidence.accepted) == ([14.0], [3.0])
    assert choose_depth(cost, 1, 1, evidence.reached, evidence.accepted) == 0
    plain_steps = 0
    while choose_depth(cost, 1, 1, evidence.reached, evidence.accepted) == 0:
        evidence.fade()  # a plain step: nothing reached
        evidence.record(0, 0, 0)
        plain_steps += 1
        assert plain_steps < 20
    assert 1 <= plain_steps <= 8
    assert evidence.reached[0] == pytest.approx(14 * EVIDENCE_DECAY ** plain_steps)
    # new drafts count in full, the old ones faded
    evidence.fade()
    evidence.record(0, 1, 1)
    assert evidence.reached[0] == pytest.approx(14 * EVIDENCE_DECAY ** (plain_steps + 1) + 1)
    assert evidence.accepted[0] == pytest.approx(3 * EVIDENCE_DECAY ** (plain_steps + 1) + 1)
    # without fading, the estimate that stopped drafting would never move: plain to the end
    assert all(choose_depth(cost, 1, 1, [14], [3]) == 0 for _ in range(50))


def test_the_evidence_is_kept_per_row_and_leaves_with_its_request() -> None:
    from spec_fast.engine.batch_depth import DepthEvidence

    evidence = DepthEvidence()
    evidence.record(0, 2, 2)  # row 0: both levels accepted
    evidence.record(1, 2, 0)  # row 1: neither
    evidence.record(1, 1, 1)  # row 1 again: one level, accepted
    assert (evidence.reached, evidence.accepted) == ([3.0, 2.0], [2.0, 1.0])
    evidence.take_rows([1])  # row 0 leaves, and what it taught goes with it
    assert (evidence.reached, evidence.accepted) == ([2.0, 1.0], [1.0, 0.0])
    joining = DepthEvidence()
    joining.record(2, 1, 1)  # the third row of the joining batch
    evidence.join(joining, own_rows=1, joining_rows=3)
    assert len(evidence.rows_reached) == 4
    assert (evidence.reached, evidence.accepted) == ([3.0, 1.0], [2.0, 0.0])
    evidence.take_rows([3, 0])
    assert evidence.rows_reached == [[1.0], [2.0, 1.0]]


def test_plain_steps_hand_a_retrieval_drafter_the_committed_tokens_at_once() -> None:
    # a drafter that needs no pass over committed tokens records a plain step's tokens at its commit (as the
    # prefill records a prompt), so the next drafted step feeds it the root alone, and drafts what a
    # decoder whose prompt was the whole text drafts
    from spec_fast.engine.batch_depth import forcing

    decoder = SpeculativeDecoder(LEAN, RetrievalDrafter(None, 48), parse_strategy("chain:1"))
    prompts = [[3, 4, 5, 3, 4, 5, 3, 4], [7, 8, 9, 7, 8]]
    st = decoder.begin(prompts, [20] * 2, [SamplingParams()] * 2, [0, 1], set())
    st.step_cost = forcing(0, 1)
    for _ in range(5):
        decoder.step(st)
    head = st.heads[0]
    for b in range(2):
        assert head.pending[b] == [st.committed[b][-1]]
        assert head.state.committed[b] == st.committed[b][:-1]
    st.step_cost, st.trees = forcing(1, 1), []
    decoder.step(st)
    assert head.pending_width == 1
    texts = [prompt + outputs[:5] for prompt, outputs in zip(prompts, st.outputs)]  # before the drafted step
    fresh = decoder.begin(texts, [20] * 2, [SamplingParams()] * 2, [0, 1], set())
    fresh.step_cost, fresh.trees = forcing(1, 1), []
    decoder.step(fresh)
    assert torch.equal(st.trees[-1].tokens, fresh.trees[-1].tokens)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_the_pass_cost_is_timed_on_the_asked_block_shape(tree: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from spec_fast.engine.batch_depth import measure_pass_cost
    from spec_fast.kv_cache import TreeKVCache

    seen: list[list[int]] = []
    forward = TreeKVCache.forward

    def recording(self: TreeKVCache, tokens: torch.Tensor, parents: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(parents[0].tolist())
        return forward(self, tokens, parents, *args, **kwargs)

    monkeypatch.setattr(TreeKVCache, "forward", recording)
    cost = measure_pass_cost(TARGET, torch.device("cpu"), rows=(2,), tokens=(5,), context=4, repeats=1, tree=tree)
    assert set(cost.seconds) == {(2, 5)} and cost(2, 5) > 0
    assert seen[0] == [-1, 0, 1, 2]  # the context is a chain either way
    assert seen[1:] == [[-1, 0, 0, 1, 1] if tree else [-1, 0, 1, 2, 3]] * 2  # warm-up and timed pass


@pytest.mark.parametrize("strategy", ["chain:3", "topk:2,2,4", "dynatree"])
def test_the_step_cost_times_whole_steps_at_every_depth_and_leaves_the_controller_alone(
        strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from spec_fast.engine.batch_depth import (BLOCK_STEPS, WARM_STEPS, choose_depth, forcing, measure_step_cost,
                                              measured_depths)

    decoder = decoder_for(strategy + "+adaptive")
    depth = decoder.strategy.depth
    # the forcing table makes the policy pick exactly the asked depth, whatever the rows and history
    for d in range(depth + 1):
        assert all(choose_depth(forcing(d, depth), rows, depth, [5] * depth, [r] * depth) == d
                   for rows in (1, 3, 8) for r in (0, 5))
    caps: list[int] = []
    step = SpeculativeDecoder.step

    def recording(self: SpeculativeDecoder, st: DecodeState) -> list[list[int]]:
        caps.append(max(self.depth_caps(st)))
        return step(self, st)

    monkeypatch.setattr(SpeculativeDecoder, "step", recording)
    before = decoder.controller.__dict__.copy() if decoder.controller is not None else None
    begun: list[list[list[int]]] = []
    begin = SpeculativeDecoder.begin
    monkeypatch.setattr(SpeculativeDecoder, "begin",
                        lambda self, prompts, *args: begun.append(prompts) or begin(self, prompts, *args))
    cost = measure_step_cost(decoder, depth, rows=(1, 3), context=6, repeats=2)
    # each prompt is a run said twice: a drafter that copies from the context finds what to draft
    assert [len(p) for p in begun] == [1, 3] and all(p[:3] == p[3:] for prompts in begun for p in prompts)
    measured = measured_depths(depth)
    assert set(cost.seconds) == {(r, d + 1) for r in (1, 3) for d in measured}
    assert all(seconds > 0 for seconds in cost.seconds.values())
    # the depths take turns in runs of BLOCK_STEPS steps, in increasing then decreasing order: WARM_STEPS
    # untimed rounds, then 2 timed ones, for each row count
    assert WARM_STEPS == 2 and BLOCK_STEPS >= 2
    orders = [measured, measured[::-1]]
    assert caps == [d for _ in (1, 3) for r in range(WARM_STEPS + 2) for d in orders[r % 2] for _ in range(BLOCK_STEPS)]
    if before is not None:  # the timing steps ran without the decoder's +adaptive controller
        assert decoder.controller.__dict__ == before
    assert decoder.step_cost() is decoder.step_cost()  # measured once per thread count


def test_the_step_cost_table_times_spaced_depths_and_draws_lines_between_them() -> None:
    from spec_fast.engine.batch_depth import PassCost, measured_depths

    assert measured_depths(0) == [0] and measured_depths(4) == [0, 1, 2, 3, 4]
    assert measured_depths(8) == [0, 1, 2, 3, 4, 6, 8] and measured_depths(9) == [0, 1, 2, 3, 4, 6, 8, 9]
    assert measured_depths(32) == [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    cost = PassCost({(1, 1): 1.0, (1, 5): 2.0, (1, 7): 3.0, (4, 1): 2.0, (4, 5): 6.0})
    assert cost(1, 5) == 2.0 and cost(1, 6) == 2.5 and cost(1, 9) == 3.0  # a line between, the widest beyond
    assert cost(1, 3) == 1.5 and cost(2, 3) == 4.0 and cost(8, 1) == 4.0  # rows: the nearest above, scaled beyond
    assert cost(4, 7) == 6.0  # the widths of the row count it reads

def test_with_the_cost_policy_greedy_requests_decode_as_alone_and_a_seeded_schedule_repeats() -> None:
    decoder = decoder_for("chain:3")
    arrivals = schedule(seed=9, sampled=True, greedy=True)
    first = run(decoder, arrivals, depth_policy="cost")
    assert run(decoder, arrivals, depth_policy="cost")[:2] == first[:2]
    for i, arrival in enumerate(arrivals):
        if arrival.sampling.greedy and first[1][i] == "length":
            assert first[0][i] == alone(decoder, arrival)


@pytest.mark.parametrize("native_layers", [True, False], ids=["native-layer", "python-layer"])
def test_the_lean_cache_never_reads_a_slot_before_writing_it(native_layers: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # the lean cache's buffers are not zeroed (spec_fast.lean.cache.uninitialised); filled with NaN here, any
    # slot read before a pass wrote it (a join, a departure, a commit, a growing buffer) would turn a logit NaN
    from spec_fast.lean import cache as lean_cache

    lean = LeanLlama.from_hf(TARGET, "float32")
    lean.use_native_layers(native_layers)
    decoder = decoder_for("chain:3", lean, EarlyExitDrafter(lean, 2))
    arrivals = schedule(seed=5, sampled=True, greedy=True)
    monkeypatch.setattr(lean_cache, "INITIAL_SLOTS", 4)  # buffers grow inside passes as well
    for fill in (0.0, float("nan")):
        monkeypatch.setattr(lean_cache, "uninitialised", lambda like, *shape, fill=fill: torch.full(
            shape, fill, dtype=like.dtype, device=like.device))
        if fill == 0.0:
            expected = run(decoder, arrivals)
    assert run(decoder, arrivals) == expected
    # control: a reader past the length does see the NaN
    buffer = lean_cache.LeanLayerCache()
    buffer.keys = torch.zeros(1, 1, 2, 8)
    assert bool(buffer._keys[:, :, 2:].isnan().all()) and not bool(buffer.keys.isnan().any())


def test_a_batch_engine_times_steps_up_to_the_row_count_that_holds_its_largest_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from spec_fast.engine import decoder as decoder_module
    from spec_fast.engine.batch_depth import PassCost

    timed: list[tuple[int, ...]] = []

    def fake(decoder: Any, max_depth: int, rows: tuple[int, ...] = (1, 2, 4, 8)) -> PassCost:
        timed.append(tuple(rows))
        return PassCost({(r, t): float(r * t) for r in rows for t in range(1, max_depth + 2)})

    monkeypatch.setattr(decoder_module, "measure_step_cost", fake)
    decoder = decoder_for("chain:2")
    for max_batch in (1, 3, 4, 5, 16):
        engine = BatchEngine(decoder, max_batch_size=max_batch, eos_token_id=None)
        engine.add_request([1, 2, 3], SamplingParams(), max_new_tokens=2)
        engine.step()
    assert timed == [(1,), (1, 2, 4), (1, 2, 4, 8)]  # max_batch 4 reuses 3's table; 16 scales 8's
