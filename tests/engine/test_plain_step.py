"""The plain step's shortcut (spec_fast/engine/plain_step.py) against the general step it stands in for.

Every case decodes twice with one decoder, once as shipped and once with the shortcut switched off (the
general step's four phases on a one-node tree), and compares what a user and the next step see: the tokens,
finish reasons, metrics (times aside), the state's roots, committed text, counters and the target cache's
lengths. Each case also counts the steps the shortcut took, so a shortcut that never applies fails too.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import spec_fast.engine.decoder as decoder_module
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.heads import FeatureHead, HeadDrafter
from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex
from spec_fast.engine import SpeculativeDecoder
from spec_fast.engine.adaptive import AdaptiveController
from spec_fast.engine.batch_engine import BatchEngine
from spec_fast.engine.plain_step import plain_step
from spec_fast.kv_cache import TreeKVCache
from spec_fast._sampling import first_max_index
from spec_fast.lean import LeanLlama, native
from spec_fast.lean.quant import LeanLinear
from spec_fast.lean.causal_pass import causal_logits
from spec_fast.strategies import parse_strategy
from tests.engine.models import tiny_llama

VOCAB = 48
HF_TARGET = tiny_llama(vocab_size=VOCAB, seed=7)
LEAN_TARGET = LeanLlama.from_hf(HF_TARGET)
PROMPTS = [[1, 5, 7, 9, 3, 2], [4, 2], [8, 8, 1, 3, 30, 2, 2, 9, 1, 6], [40]]
RETRIEVAL = RetrievalDrafter(SuffixIndex([[1, 5, 7, 9, 3, 2, 2, 8], [4, 2, 6, 6, 1], [8, 8, 1, 3, 5, 7]], VOCAB, 4),
                             VOCAB, 4)
TIME_FIELDS = {"wall_s", "ttft_s", "tokens_per_s", "tpot_s", "selector_s", "selector_ms", "peak_memory_bytes"}


class Counted:
    """``plain_step`` that counts the steps it took (returned non-None) and the steps it declined."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.taken, self.declined = enabled, 0, 0

    def __call__(self, *args: Any) -> Any:
        out = plain_step(*args) if self.enabled else None
        if out is None:
            self.declined += 1
        else:
            self.taken += 1
        return out


def both_ways(monkeypatch: pytest.MonkeyPatch, run: Any) -> tuple[Any, Any, Counted]:
    """``run()`` with the shortcut on, then off; returns both results and the counts of the first."""
    results, counts = [], []
    for enabled in (True, False):
        counted = Counted(enabled)
        monkeypatch.setattr(decoder_module, "plain_step", counted)
        results.append(run())
        counts.append(counted)
    return results[0], results[1], counts[0]


def metrics_of(result: Any) -> dict[str, Any]:
    return {k: v for k, v in result.metrics.as_dict().items() if k not in TIME_FIELDS}


def state_of(result: Any) -> dict[str, Any]:
    st = result.state
    return {"roots": st.roots, "committed": st.committed, "outputs": st.outputs, "active": st.active,
            "steps": st.steps, "row_steps": st.row_steps.tolist(), "lengths": st.target_cache.lengths.tolist(),
            "context": st.target_cache.context_size, "accepted": st.step_accepted, "drafted": st.step_drafted,
            "pending": [head.pending for head in st.heads],
            "evidence": (st.depth_evidence.rows_reached, st.depth_evidence.rows_accepted)}


@pytest.mark.parametrize("target", [HF_TARGET, LEAN_TARGET], ids=["hf", "lean"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.9, seed=3)],
                         ids=["greedy", "sampled"])
def test_plain_decoding_gives_the_general_steps_tokens_metrics_and_state(monkeypatch: pytest.MonkeyPatch,
                                                                         target: Any, sampling: SamplingParams
                                                                         ) -> None:
    decoder = SpeculativeDecoder(target, None, parse_strategy("ar"))
    for prompts, eos in (([PROMPTS[0]], None), (PROMPTS, None), (PROMPTS, 3)):
        # one row; ragged rows, all running to the end; ragged rows of which some stop early (the others
        # then run beside finished rows: the general step's case)
        fast, general, counted = both_ways(monkeypatch, lambda: decoder.generate(
            prompts, max_new_tokens=14, sampling=sampling, eos_token_id=eos))
        assert fast.tokens == general.tokens
        assert metrics_of(fast) == metrics_of(general)
        assert state_of(fast) == state_of(general)
        assert counted.taken >= 5


def test_a_running_batch_with_arrivals_and_departures_gets_the_same_outputs(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    """Requests join a running batch (ragged rows: the padded cache's path), leave it, and one is aborted."""
    decoder = SpeculativeDecoder(LEAN_TARGET, None, parse_strategy("ar"))

    def drive(sampled: bool) -> list[tuple[int, list[int], bool, str | None]]:
        engine = BatchEngine(decoder, max_batch_size=3, eos_token_id=5)
        seen = []
        for step in range(40):
            if step < len(PROMPTS):
                sampling = SamplingParams(temperature=0.8, seed=step) if sampled else SamplingParams()
                engine.add_request(PROMPTS[step], sampling, 6 + 3 * step)
            if step == 6:
                engine.abort(1)
            seen.extend((o.request_id, o.new_tokens, o.finished, o.finish_reason) for o in engine.step())
            if not engine.has_unfinished():
                break
        return seen

    for sampled in (False, True):
        fast, general, counted = both_ways(monkeypatch, lambda: drive(sampled))
        assert fast == general
        assert counted.taken >= 10


def rnn_drafter() -> HeadDrafter:
    torch.manual_seed(4)
    head = FeatureHead(HF_TARGET, "rnn", torch.arange(0, VOCAB, 2)).eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return HeadDrafter(head)


@pytest.mark.parametrize("target", [HF_TARGET, LEAN_TARGET], ids=["hf", "lean"])
@pytest.mark.parametrize("strategy,drafter", [("chain:3+adaptive", RETRIEVAL),
                                              ("chain:2+adaptive", EarlyExitDrafter(HF_TARGET, 1)),
                                              ("chain:3+adaptive", rnn_drafter())],
                         ids=["retrieval", "early-exit", "rnn-head"])
def test_plain_steps_of_a_drafting_decoder_keep_the_drafters_state(monkeypatch: pytest.MonkeyPatch, strategy: str,
                                                                   drafter: Any, target: Any) -> None:
    """The drafters' pending tokens (retrieval absorbs them), a trained head's features of the committed
    entries (the plain step hands them over), the proposer's chain statistics and the depth evidence after
    plain steps taken between drafted ones (``+adaptive``'s controller chooses the kind of each step)."""
    if target is LEAN_TARGET and isinstance(drafter, EarlyExitDrafter):
        pytest.skip("the early-exit drafter reads the HF target's layers")
    decoder = SpeculativeDecoder(target, drafter, parse_strategy(strategy))

    def run() -> Any:
        # the controller chooses from measured step times, which the shortcut changes: here every third step
        # drafts, and decoding starts without the drafter's prefill, in both runs alike
        steps = iter(range(10_000))
        monkeypatch.setattr(AdaptiveController, "speculate", lambda self, hint=0: next(steps) % 3 == 2)
        monkeypatch.setattr(AdaptiveController, "peek", lambda self, hint=0: False)
        return decoder.generate(PROMPTS[:2], max_new_tokens=30)

    fast, general, counted = both_ways(monkeypatch, run)
    assert fast.tokens == general.tokens
    assert metrics_of(fast) == metrics_of(general)
    assert state_of(fast) == state_of(general)
    assert counted.taken >= 5 and sum(fast.metrics.depth_reached) >= 5  # plain and drafted steps both ran
    if isinstance(drafter, HeadDrafter):
        histories = [[rows.tolist() for rows in result.state.heads[0].state.history] for result in (fast, general)]
        assert histories[0] == histories[1]


def test_mixed_greedy_and_sampled_rows_take_the_general_step(monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = SpeculativeDecoder(LEAN_TARGET, None, parse_strategy("ar"))

    def drive() -> list[list[int]]:
        engine = BatchEngine(decoder, max_batch_size=2)
        ids = [engine.add_request(PROMPTS[0], SamplingParams(), 8),
               engine.add_request(PROMPTS[1], SamplingParams(temperature=0.7, seed=1), 8)]
        tokens: dict[int, list[int]] = {i: [] for i in ids}
        while engine.has_unfinished():
            for out in engine.step():
                tokens[out.request_id].extend(out.new_tokens)
        return [tokens[i] for i in ids]

    fast, general, counted = both_ways(monkeypatch, drive)
    assert fast == general
    assert counted.taken == 0 and counted.declined > 0


@pytest.mark.parametrize("target", [HF_TARGET, LEAN_TARGET], ids=["hf", "lean"])
@pytest.mark.parametrize("lengths", [[5, 5, 5], [5, 2, 7]], ids=["aligned", "ragged"])
def test_forward_committed_equals_a_forward_and_a_commit_of_every_entry(target: Any, lengths: list[int]) -> None:
    torch.manual_seed(0)
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in lengths]
    caches = []
    for _ in range(2):
        cache = TreeKVCache(target, len(prompts), torch.device("cpu"))
        # each row's prompt, then a commit of its own length: the rows' contexts as the engine leaves them
        width = max(lengths)
        tokens = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
        parents = torch.tensor([[i - 1 if i < len(p) else -1 for i in range(width)] for p in prompts])
        cache.forward(tokens, parents)
        cache.commit(torch.arange(width).expand(len(prompts), width).contiguous(), torch.tensor(lengths))
        caches.append(cache)
    assert caches[0].padded == (len(set(lengths)) > 1)
    step = torch.tensor([[3], [11], [40]])
    for _ in range(3):
        fused = caches[0].forward_committed(step)
        general = caches[1].forward(step, torch.full_like(step, -1))
        caches[1].commit(torch.zeros_like(step), torch.ones(3, dtype=torch.long))
        assert torch.equal(fused.logits, general.logits)
        assert caches[0].lengths.tolist() == caches[1].lengths.tolist()
        assert caches[0].context_size == caches[1].context_size and caches[0].num_block == 0
        step = fused.logits[:, -1].argmax(dim=-1, keepdim=True)
    assert caches[0].passes == caches[1].passes


def test_forward_committed_rejects_bad_tokens_and_block_entries() -> None:
    cache = TreeKVCache(HF_TARGET, 2, torch.device("cpu"))
    cache.forward(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[-1, 0], [-1, 0]]))
    with pytest.raises(ValueError, match="forward_committed"):
        cache.forward_committed(torch.tensor([[1], [2]]))
    cache.commit(torch.tensor([[0, 1], [0, 1]]), torch.tensor([2, 2]), prefix_of_block=True)
    with pytest.raises(ValueError, match=r"tokens must be \[B, 1\]"):
        cache.forward_committed(torch.tensor([[1, 2], [3, 4]]))


def with_block_head(model: LeanLlama) -> LeanLlama:
    """A copy of ``model`` whose head is Q8_0 blocks (the default model's head format)."""
    torch.manual_seed(2)
    blocks = copy.deepcopy(model)
    head = blocks.lm_head
    values = torch.randint(-128, 128, (head.out_features, head.in_features), dtype=torch.int8)
    scales = (torch.rand(head.out_features, head.in_features // native.GROUP) * 0.05).half().float()
    blocks.lm_head = LeanLinear.from_blocks("q8_0", values, scales, None)
    return blocks


BLOCK_HEAD_TARGET = with_block_head(LEAN_TARGET)


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("target", [LEAN_TARGET, BLOCK_HEAD_TARGET], ids=["float32-head", "q8_0-head"])
def test_the_lean_causal_pass_gives_forwards_bits(batch: int, width: int, target: LeanLlama) -> None:
    """The pass of plain steps (one token) and greedy chains (several; spec_fast/lean/causal_pass.py,
    ``LeanLlama.forward_step``) against ``forward`` with the same positions and no mask (causal), pass after
    pass, on two caches filled alike; with a head of blocks the one native call's first maxima are
    ``first_max_index`` of its logits. The final normed states it returns (a trained draft head reads them)
    are forward's ``final_hidden_state_only`` ones, bit for bit."""
    assert native.available()
    torch.manual_seed(1)
    prompt = torch.randint(0, VOCAB, (batch, 6))
    caches = [target.make_tree_cache(batch) for _ in range(2)]
    for cache in caches:
        target(prompt, past_key_values=cache)
    step = torch.randint(0, VOCAB, (batch, width))
    for position in range(6, 6 + 6 * width, width):
        done = causal_logits(target, step, position, caches[0])
        assert done is not None  # the case it covers: it ran
        fast, first_max, normed = done
        positions = (torch.arange(width) + position).expand(batch, width)
        reference = target(step, position_ids=positions, past_key_values=caches[1], output_hidden_states=True,
                           final_hidden_state_only=True)
        assert fast.shape == (batch, width, VOCAB) and torch.equal(fast, reference.logits)
        assert reference.hidden_states is not None and torch.equal(normed, reference.hidden_states[-1])
        if target is BLOCK_HEAD_TARGET:
            assert first_max is not None and torch.equal(first_max, first_max_index(fast))
        else:
            assert first_max is None
        assert caches[0].get_seq_length() == caches[1].get_seq_length() == position + width
        step = torch.cat([fast[:, -1:].argmax(dim=-1), step[:, :-1].flip(1)], dim=1)


def test_a_plain_step_takes_the_models_own_argmax(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy plain decoding on a head of blocks reads the maxima the model's pass computed (no argmax over the
    logits after it) and gives the tokens of the general step, which takes the argmax itself."""
    decoder = SpeculativeDecoder(BLOCK_HEAD_TARGET, None, parse_strategy("ar"))
    reductions = []
    import spec_fast.engine.plain_step as plain_module
    monkeypatch.setattr(plain_module, "first_max_index", lambda *a: reductions.append(1) or first_max_index(*a))
    prompts = [PROMPTS[0], PROMPTS[0][::-1]]  # rows of one length: an unpadded cache, the one-call pass
    fast, general, counted = both_ways(monkeypatch, lambda: decoder.generate(prompts, max_new_tokens=12).tokens)
    assert fast == general and counted.taken >= 5 and not reductions


def test_the_lean_causal_pass_declines_what_it_does_not_cover() -> None:
    cache = LEAN_TARGET.make_tree_cache(1)
    LEAN_TARGET(torch.tensor([[1, 2, 3]]), past_key_values=cache)
    token = torch.tensor([[4]])
    assert causal_logits(LEAN_TARGET, token, 2, cache) is None  # not the cache's length
    full = LEAN_TARGET.make_tree_cache(1)
    table = int(LEAN_TARGET.model.rotary.cos.shape[0])
    LEAN_TARGET(torch.randint(0, VOCAB, (1, table)), past_key_values=full)
    assert causal_logits(LEAN_TARGET, token, table, full) is None  # past the rotary table
    near = LEAN_TARGET.make_tree_cache(1)
    LEAN_TARGET(torch.randint(0, VOCAB, (1, table - 2)), past_key_values=near)
    assert causal_logits(LEAN_TARGET, torch.tensor([[4, 5, 6]]), table - 2, near) is None  # a chain past it
    python_layers = LeanLlama.from_hf(HF_TARGET)
    python_layers.use_native_layers(False)
    other = python_layers.make_tree_cache(1)
    python_layers(torch.tensor([[1, 2, 3]]), past_key_values=other)
    assert causal_logits(python_layers, token, 3, other) is None
    # forward_step still serves those cases, through forward
    out = python_layers.forward_step(token, 3, other)
    assert out.logits.shape == (1, 1, VOCAB) and other.get_seq_length() == 4
