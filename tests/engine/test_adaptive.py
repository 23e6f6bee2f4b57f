"""``+adaptive``: the speculation controller (probing schedule, memory across calls) and exactness of the
lazy draft prefill it enables."""

from __future__ import annotations

import pytest

from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.engine.adaptive import AdaptiveController
from spec_fast.engine import SamplingParams, SpeculativeDecoder
from spec_fast.strategies import parse_strategy
from tests.engine.models import hf_greedy, tiny_llama

PROMPTS = [[1, 5, 7, 9, 3], [4, 2], [8, 8, 8, 8, 8, 8, 8, 1]]


def _drive(controller: AdaptiveController, steps: int, spec_rate: float, plain_rate: float) -> list[bool]:
    """Run ``steps`` decisions where speculative steps yield ``spec_rate`` tokens/s and plain ones
    ``plain_rate``; return the decisions."""
    kinds = []
    for _ in range(steps):
        spec = controller.speculate()
        kinds.append(spec)
        controller.observe(spec, 1.0, 1.0 / (spec_rate if spec else plain_rate))
    return kinds


@pytest.mark.parametrize(("spec_rate", "factor"), [(1.0, 4), (1.7, 2)])
def test_controller_probes_the_losing_kind_with_growing_intervals_up_to_a_cap(spec_rate: float, factor: int) -> None:
    """A clear loser (half the rate) is probed after 4, 16, 64 = cap steps; a close one after 4, 8, 16, ..."""
    cap = 4 * factor * factor
    controller = AdaptiveController(probe_every=4, max_interval=cap)
    kinds = _drive(controller, 400, spec_rate=spec_rate, plain_rate=2.0)
    assert kinds[:2] == [True, False]  # one step of each kind first
    probes = [i for i, k in enumerate(kinds) if k and i > 0]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # a gap counts the probe itself
    assert probes[0] == 2 + 4 and gaps[:2] == [4 * factor + 1, cap + 1] and set(gaps[2:]) == {cap + 1}
    assert sum(kinds) <= 3 + len(kinds) // (cap + 1)  # the first step and the probes


def test_controller_goes_back_to_short_probes_when_a_probe_flips_the_choice() -> None:
    controller = AdaptiveController(probe_every=4, max_interval=64)
    _drive(controller, 200, spec_rate=1.0, plain_rate=2.0)
    assert controller.probe_every[0] == 64
    kinds = _drive(controller, 200, spec_rate=5.0, plain_rate=2.0)  # speculation starts to pay
    assert controller.probe_every[0] < 64 or kinds[-50:].count(True) > 45
    assert kinds[-50:].count(True) > 45


def test_peek_does_not_count_a_step() -> None:
    controller = AdaptiveController(probe_every=2)
    _drive(controller, 5, spec_rate=1.0, plain_rate=2.0)
    state = (controller.since_probe, controller.probe_every)
    assert controller.peek() == controller.peek()
    assert (controller.since_probe, controller.probe_every) == state


def test_decoder_keeps_its_controller_across_greedy_calls_and_sampling_never_consults_it() -> None:
    target = tiny_llama()
    decoder = SpeculativeDecoder(target, EarlyExitDrafter(target, 2), parse_strategy("chain:2+adaptive"))
    decoder.generate([PROMPTS[0]], max_new_tokens=6)
    greedy = decoder.controller
    assert greedy is not None
    steps = greedy.steps
    decoder.generate([PROMPTS[1]], max_new_tokens=6)
    assert decoder.controller is greedy and greedy.steps > steps
    steps = greedy.steps
    result = decoder.generate([PROMPTS[1]], max_new_tokens=6, sampling=SamplingParams(temperature=1.0, seed=1))
    assert greedy.steps == steps and result.state is not None and result.state.controller is None


@pytest.mark.parametrize("strategy", ["chain:3+adaptive", "iid:2x2+adaptive", "topk:3,2,5+adaptive", "dynatree+adaptive"])
def test_lazy_draft_prefill_stays_byte_identical_to_hf_generate(strategy: str) -> None:
    """A controller that prefers plain steps skips the draft prefill; its later probes must feed the whole
    waiting prompt to the drafter. Forced here: plain steps are measured as much faster."""
    target = tiny_llama()
    decoder = SpeculativeDecoder(target, EarlyExitDrafter(target, 2), parse_strategy(strategy))
    controller = AdaptiveController(probe_every=3)
    controller.observe(True, 1.0, 10.0)
    controller.observe(False, 1.0, 0.001)
    decoder.controller = controller
    # measured seconds of real steps would let speculation win back; freeze the rates
    controller.observe = lambda spec, tokens, seconds, hint=0: AdaptiveController.observe(  # type: ignore[method-assign]
        controller, spec, 1.0, 10.0 if spec else 0.001, hint)
    assert not controller.peek()
    draft_passes = 0
    for prompt in PROMPTS:
        result = decoder.generate([prompt], max_new_tokens=20)
        assert result.tokens == [hf_greedy(target, prompt, 20)]
        assert result.state is not None and not result.state.heads[0].prefilled
        draft_passes += result.metrics.draft_passes
    assert draft_passes >= 1  # the probes did draft
    batch = decoder.generate(PROMPTS, max_new_tokens=20)  # ragged batch, lazily prefilled
    assert batch.tokens == [hf_greedy(target, p, 20) for p in PROMPTS]


def test_controller_learns_per_hint_class_where_speculation_pays() -> None:
    """Hint 3 (a long match): a speculative step yields 3 tokens; hint 0 (no match): 1 token; a speculative
    step takes 1.5 s, a plain one 1 s. After its first steps the controller drafts in class 3 and steps
    plainly in class 0, apart from probes whose intervals grow. The known-bad variant, the same controller
    given no hints (one class, 2 tokens per 1.5 s on average), speculates everywhere: the check rejects it."""

    def run(controller: AdaptiveController, use_hint: bool) -> dict[int, list[bool]]:
        kinds: dict[int, list[bool]] = {0: [], 3: []}
        for i in range(400):
            hint = 3 if i % 2 else 0
            spec = controller.speculate(hint if use_hint else 0)
            kinds[hint].append(spec)
            controller.observe(spec, (3.0 if hint == 3 else 1.0) if spec else 1.0, 1.5 if spec else 1.0,
                               hint if use_hint else 0)
        return kinds

    kinds = run(AdaptiveController(probe_every=4, max_interval=64), use_hint=True)
    assert kinds[3][20:].count(False) <= 4  # only probes of plain steps
    assert kinds[0][20:].count(True) <= 6  # only probes of speculation
    blind = run(AdaptiveController(probe_every=4, max_interval=64), use_hint=False)
    assert blind[0][20:].count(True) > 6  # the negative control: speculates with no match


def test_hints_are_clipped_into_the_classes_and_an_unseen_class_is_explored_once() -> None:
    controller = AdaptiveController(probe_every=4)
    controller.observe(True, 1.0, 1.0, 0)
    controller.observe(False, 1.0, 0.1, 0)
    assert not controller.speculate(0)  # plain is ten times faster in class 0
    assert controller.speculate(7) and controller.hint_class(7) == controller.hint_class(3) == 3
    controller.observe(True, 1.0, 1.0, 7)
    assert not controller.speculate(3) and not controller.peek(-1)


def test_the_retrieval_draft_absorbs_a_prompt_as_its_forward_pass_would_and_forecasts_from_it() -> None:
    import torch

    from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex

    index = SuffixIndex([[5, 6, 7, 8, 9], [1, 2, 3]], vocab_size=16)
    drafter = RetrievalDrafter(index, 16)
    prompt = [4, 5, 6, 7, 4, 5]
    by_pass = drafter.begin(1, torch.device("cpu"))
    drafter.forward(by_pass, torch.tensor([prompt]), torch.arange(-1, len(prompt) - 1).unsqueeze(0))
    drafter.commit(by_pass, torch.arange(len(prompt)).unsqueeze(0), torch.tensor([len(prompt)]))
    absorbed = drafter.begin(1, torch.device("cpu"))
    drafter.absorb(absorbed, [prompt])
    assert absorbed.committed == by_pass.committed and absorbed.block_tokens == by_pass.block_tokens == [[]]
    assert drafter.match_length(absorbed, 0, [6]) == 3  # "5 6" then 6: own text "4 5 6" ... 3 tokens
    assert drafter.match_length(absorbed, 0, [15]) == 0
    rng = __import__("random").Random(0)
    for _ in range(200):  # the forecast is sparse_law's match length, without its law
        tail = [rng.randrange(10) for _ in range(rng.randrange(1, 4))]
        expected = drafter.sparse_law(absorbed.committed[0] + tail)[0]
        assert drafter.match_length(absorbed, 0, tail) == expected, tail


def test_greedy_retrieval_adaptive_output_equals_plain_decoding_whatever_the_hints() -> None:
    from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex

    target = tiny_llama()
    vocab = int(target.config.vocab_size)
    index = SuffixIndex([[t % vocab for t in range(3, 40)]] * 2, vocab_size=vocab)
    decoder = SpeculativeDecoder(target, RetrievalDrafter(index, vocab), parse_strategy("chain:2+adaptive"))
    for prompt in PROMPTS:
        assert decoder.generate([prompt], max_new_tokens=16).tokens == [hf_greedy(target, prompt, 16)]
    assert decoder.controller is not None and len(decoder.controller.spec_tokens) >= 1
