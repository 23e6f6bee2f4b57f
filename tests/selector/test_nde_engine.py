"""Decoding with the NDE selector (``--strategy nde``, spec_fast.nde; seed 002 (docs/papers.md) section 6).

* greedy NDE output equals greedy AR token for token (random selector nets, tiny random models);
* the chosen shape changes across steps in a real run (a crafted selector whose choice follows the
  context length), and every step's verified tree has the chosen shape;
* the features the engine hands the selector are the hidden states of the token before the root and of
  the root, equal to a plain teacher-forced forward of each model over the committed tokens;
* drafters without hidden states are refused at setup.

The sampling law with per-step shape changes is tested in tests/engine/test_sampling_statistical.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from spec_fast.decoding import SamplingParams
from spec_fast.drafts.model import Drafter, EarlyExitDrafter, ModelDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.nde.latency import LatencyModel, PassTimeFit
from spec_fast.nde import HiddenRecorder, NdeChoice, NdeSelector
from spec_fast.nde.selector import SCALAR_FEATURES, RootFeatures, SelectorConfig, SelectorNet
from spec_fast.strategies import parse_strategy
from tests.engine.models import hf_greedy, tiny_llama

PROMPTS = [[1, 5, 7, 9, 3], [4, 2], [8, 8, 8, 8, 8, 8, 8, 1], [60]]
NEW_TOKENS = 20
LATENCY = LatencyModel(PassTimeFit(0.01, 0.001, 1e-5), PassTimeFit(0.1, 0.01, 1e-4))


def random_selector(hidden: int, seed: int, scale: float = 3.0) -> NdeSelector:
    """A random SelectorNet with spread-out logits (so different roots can pick different actions)."""
    torch.manual_seed(seed)
    net = SelectorNet(SelectorConfig(hidden, hidden, dropout=0.0))
    with torch.no_grad():
        for p in net.mlp.parameters():
            p.mul_(scale)
    return NdeSelector(net.eval(), LATENCY)


#: actions the crafted selector cycles through (plain step, chain, i.i.d., delayed, wide delayed)
CYCLE = ((1, 0, 0), (1, 2, 1), (3, 0, 2), (2, 1, 2), (4, 2, 3))


class ContextCycleNet(SelectorNet):
    """Crafted policy: the action ``CYCLE[|x| mod 5]`` (a function of the context length, so the shape
    still depends on the committed context only)."""

    def forward(self, features: RootFeatures) -> torch.Tensor:
        lengths = features.scalars[:, SCALAR_FEATURES.index("context_length")].long()
        # every other action far below: the selector sums the policy over the actions of one tree
        logits = torch.full((features.batch_size, self.config.num_actions), -30.0)
        index = {a: i for i, a in enumerate(self.config.actions)}
        for b, n in enumerate(lengths.tolist()):
            logits[b, index[CYCLE[n % len(CYCLE)]]] = 0.0
        return logits


def cycling_selector(hidden: int) -> NdeSelector:
    return NdeSelector(ContextCycleNet(SelectorConfig(hidden, hidden, dropout=0.0)), LATENCY)


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_llama()


@pytest.fixture(scope="module")
def reference(target: Any) -> list[list[int]]:
    return [hf_greedy(target, p, NEW_TOKENS) for p in PROMPTS]


@pytest.mark.parametrize("seed,verifier", [(0, "specinfer"), (1, "khisti"), (2, "nss")])
def test_greedy_nde_output_equals_greedy_ar(target: Any, reference: list[list[int]], seed: int, verifier: str) -> None:
    decoder = SpeculativeDecoder(target, EarlyExitDrafter(target, 2), parse_strategy(f"nde:{verifier}"),
                                 selector=random_selector(32, seed))
    result = decoder.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    assert result.tokens == reference
    assert result.metrics.selector_steps >= 1 and result.metrics.selector_s > 0
    assert sum(result.metrics.nde_actions.values()) == result.metrics.selector_steps


def test_greedy_nde_with_a_separate_draft_model_and_shape_changes(target: Any, reference: list[list[int]]) -> None:
    decoder = SpeculativeDecoder(target, ModelDrafter(tiny_llama(layers=1, seed=7)), parse_strategy("nde"),
                                 selector=cycling_selector(32))
    for rows in ([0], [1], [3], [0, 1, 2, 3]):
        result = decoder.generate([PROMPTS[r] for r in rows], max_new_tokens=NEW_TOKENS)
        assert result.tokens == [reference[r] for r in rows]


def test_greedy_nde_with_a_feature_head_draft(target: Any, reference: list[list[int]]) -> None:
    """A trained head (rnn) reads the target's hidden states through the recorder (observe_target is passed
    on) and exposes its predicted features as its hidden states."""
    from spec_fast.drafts.heads import FeatureHead, HeadDrafter

    torch.manual_seed(2)
    head = HeadDrafter(FeatureHead(target, "rnn", torch.arange(int(target.config.vocab_size))).eval())
    seen: list[int] = []
    observe = head.observe_target

    def spy(state: Any, hidden: torch.Tensor, keep: Any = None, counts: Any = None) -> None:
        seen.append(int(hidden.shape[1]))
        observe(state, hidden, keep, counts)

    head.observe_target = spy  # type: ignore[method-assign]
    decoder = SpeculativeDecoder(target, head, parse_strategy("nde"), selector=cycling_selector(32))
    result = decoder.generate(PROMPTS[:2], max_new_tokens=NEW_TOKENS)
    assert result.tokens == reference[:2]
    assert len(seen) >= result.metrics.target_passes  # the prefill and every step


def _shape(tree: Any) -> tuple[int, int]:
    """(number of drafted nodes, depth) of row 0 of a verified tree."""
    valid = tree.valid[0]
    return int(valid.sum()) - 1, int(tree.depths[0][valid].max())


def test_chosen_shape_changes_across_steps_and_each_tree_has_it(target: Any) -> None:
    decoder = SpeculativeDecoder(target, EarlyExitDrafter(target, 2), parse_strategy("nde"),
                                 selector=cycling_selector(32))
    prompt = PROMPTS[0]
    new_tokens = 40
    result = decoder.generate([prompt], max_new_tokens=new_tokens, sampling=SamplingParams(temperature=1.0, seed=3),
                              record_trees=True)
    assert len(result.metrics.nde_actions) >= 3  # at least three different actions were chosen
    assert len(result.trees) == result.metrics.target_passes
    assert result.metrics.target_passes - 1 <= result.metrics.selector_steps <= result.metrics.target_passes
    # replay the context lengths: each step's tree is the delayed tree of CYCLE[|x| mod 5] (cut near the end)
    sequence_length = len(prompt)
    shapes = set()
    for tree in result.trees:
        k, l1, l2 = CYCLE[sequence_length % len(CYCLE)]
        nodes, depth = _shape(tree)
        cap = new_tokens - (sequence_length - len(prompt)) - 1
        assert depth == min(l1 + l2, cap)
        if l1 + l2 <= cap:  # trunk nodes are single; K branches merge by token
            assert l1 + l2 <= nodes <= l1 + k * l2
        shapes.add((nodes, depth))
        # tokens emitted this step: the accepted path + 1, read from the output by the next root's position
        sequence_length += _emitted(result, tree, sequence_length - len(prompt))
    assert sequence_length == len(prompt) + new_tokens
    assert len(shapes) >= 3


def _emitted(result: Any, tree: Any, done: int) -> int:
    """Tokens the step of ``tree`` emitted: the longest run of output tokens from position ``done`` that
    follows a root-to-node path of the tree, plus the correction/bonus token."""
    out = result.tokens[0]
    tokens, parents, valid = tree.tokens[0].tolist(), tree.parents[0].tolist(), tree.valid[0].tolist()
    node, count = 0, 0
    while done + count < len(out) - 1:
        children = [i for i in range(len(tokens)) if valid[i] and parents[i] == node and tokens[i] == out[done + count]]
        if not children:
            break
        node, count = children[0], count + 1
    return min(count + 1, len(out) - done)


class SpySelector(NdeSelector):
    """Records what the engine hands the selector at every step."""

    def __init__(self, hidden: int) -> None:
        super().__init__(SelectorNet(SelectorConfig(hidden, hidden, dropout=0.0)).eval(), LATENCY)
        self.calls: list[dict[str, Any]] = []

    def choose(self, target_hidden_prev: torch.Tensor, target_logits_prev: torch.Tensor,  # type: ignore[override]
               draft_hidden_prev: torch.Tensor, draft_logits_prev: torch.Tensor, draft_hidden_root: torch.Tensor,
               draft_logits_root: torch.Tensor, context_lengths: Any, active: Any, sampling: Any) -> NdeChoice:
        self.calls.append(dict(target_hidden_prev=target_hidden_prev.clone(), target_logits_prev=target_logits_prev.clone(),
                               draft_hidden_prev=draft_hidden_prev.clone(), draft_logits_prev=draft_logits_prev.clone(),
                               draft_hidden_root=draft_hidden_root.clone(), lengths=list(context_lengths)))
        action = CYCLE[len(self.calls) % len(CYCLE)]
        return NdeChoice(action, self.actions.index(action), 0.0)


def _teacher_forced(model: Any, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = model(torch.tensor([tokens]), output_hidden_states=True)
    return out.logits[0], out.hidden_states[-1][0]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_root_features_come_from_the_token_before_the_root(target: Any, temperature: float) -> None:
    draft_model = tiny_llama(layers=1, seed=7)
    spy = SpySelector(32)
    decoder = SpeculativeDecoder(target, ModelDrafter(draft_model), parse_strategy("nde"), selector=spy)
    prompts = [PROMPTS[0], PROMPTS[2]]
    result = decoder.generate(prompts, max_new_tokens=16, sampling=SamplingParams(temperature=temperature, seed=5))
    assert len(spy.calls) >= 3
    for b, prompt in enumerate(prompts):
        sequence = prompt + result.tokens[b]
        t_logits, t_hidden = _teacher_forced(target, sequence)
        d_logits, d_hidden = _teacher_forced(draft_model, sequence)
        for call in spy.calls:
            n = call["lengths"][b]  # committed tokens, the root included: root index n - 1
            if n > len(sequence):
                continue
            torch.testing.assert_close(call["target_hidden_prev"][b], t_hidden[n - 2], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(call["target_logits_prev"][b], t_logits[n - 2], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(call["draft_hidden_prev"][b], d_hidden[n - 2], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(call["draft_logits_prev"][b], d_logits[n - 2], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(call["draft_hidden_root"][b], d_hidden[n - 1], atol=1e-4, rtol=1e-4)


class NoHidden(Drafter):
    vocab_size = 64


def test_drafters_without_hidden_states_are_refused_at_setup(target: Any) -> None:
    with pytest.raises(ValueError, match="hidden states"):
        SpeculativeDecoder(target, NoHidden(), parse_strategy("nde"), selector=random_selector(32, 0))
    with pytest.raises(ValueError, match="needs a drafter"):
        SpeculativeDecoder(target, None, parse_strategy("nde"), selector=random_selector(32, 0))
    with pytest.raises(ValueError, match="hidden sizes"):
        SpeculativeDecoder(target, EarlyExitDrafter(target, 2), parse_strategy("nde"), selector=random_selector(16, 0))
    with pytest.raises(ValueError, match="hidden states"):
        HiddenRecorder(NoHidden())


def test_parse_nde_strategies() -> None:
    assert parse_strategy("nde").verifier == "specinfer"
    assert parse_strategy("nde:nss").label() == "nde/nss"
    for bad in ("nde:traversal", "nde+adaptive", "nde:bogus"):
        with pytest.raises(ValueError):
            parse_strategy(bad)
    with pytest.raises(ValueError, match="names verifier"):
        parse_strategy("nde:nss", "spectr")


@pytest.mark.model
def test_smollm2_greedy_nde_with_the_committed_selector_equals_greedy_ar() -> None:
    """SmolLM2 + the rnn head (the selector's draft) + the committed selector weights (latency model from a
    fixed fit, so the test does not run the warm-up). The committed policy picks one action, the one-token
    tree, at every root (bench/results/selector.md and README say why), so the shape-change check is the
    crafted one above."""
    from spec_fast.drafts.heads import load_drafter
    from spec_fast.models import chat_prompt_ids, load_model
    from spec_fast.nde import DEFAULT_SELECTOR_WEIGHTS
    from spec_fast.nde.selector_training import load_selector

    model, tokenizer = load_model()
    net, _ = load_selector(DEFAULT_SELECTOR_WEIGHTS)
    decoder = SpeculativeDecoder(model, load_drafter("rnn", model), parse_strategy("nde"),
                                 selector=NdeSelector(net, LATENCY))
    prompt = chat_prompt_ids(tokenizer, "Name three colours of the rainbow.")
    result = decoder.generate([prompt], max_new_tokens=12)
    assert result.tokens == [hf_greedy(model, prompt, 12)]
    # every step chose a shape, but a last step with one token left, which drafts nothing
    assert result.metrics.target_passes - 1 <= result.metrics.selector_steps <= result.metrics.target_passes
