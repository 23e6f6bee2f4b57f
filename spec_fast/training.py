"""Distillation of the drafts in :mod:`spec_fast.heads` from the target, on CPU, by our own code.

Pipeline (:func:`train_all`, driven by ``scripts/train_drafts.py``):

1. **data**: the target's own responses to :data:`TRAIN_PROMPTS` (chat template): one greedy response and
   ``samples`` sampled responses (temperature 0.8, fixed torch seed) per prompt, batched HF ``generate``.
2. **teacher forcing**: one target pass per sequence (prompt + response) records, at every position, the
   final normed hidden state (the feature the LM head reads) and the target's top-``k`` next-token
   log-probabilities.
3. **vocabulary subset**: the ``S`` most frequent tokens of the sequences and of the teachers' top-4.
4. **training** (AdamW, cosine schedule, fixed seed, sequence batches in a seeded order):
   ``distilled`` minimises the soft cross-entropy against the teacher's top-k distribution (renormalised
   on the subset); the heads minimise the same loss plus a smooth-L1 feature regression, on two unrolled
   steps (step 1 reads the true previous features, step 2 the features step 1 predicted, as in drafting).

:data:`HELDOUT_PROMPTS` are never used here; they are the evaluation set of ``bench/drafts.py``.
Everything is deterministic on CPU for a fixed seed and thread count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from spec_fast.heads import FeatureHead, SubsetHead, distilled_model, distilled_state

__all__ = [
    "TRAIN_PROMPTS", "HELDOUT_PROMPTS", "synthetic_prompts", "TeacherData", "TrainConfig", "generate_responses", "teacher_forcing",
    "vocabulary_subset", "train_distilled", "train_head", "heldout_agreement", "save_weights",
]

#: Prompts whose target responses are the training data (never used for evaluation).
TRAIN_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Explain photosynthesis in simple terms.",
    "Write a short poem about the sea.",
    "How do I make a cup of tea?",
    "What are the benefits of regular exercise?",
    "Give me three tips for studying effectively.",
    "What is a prime number?",
    "Describe the water cycle.",
    "Write a haiku about autumn leaves.",
    "How does a bicycle work?",
    "What is the difference between weather and climate?",
    "Tell me a fun fact about octopuses.",
    "How can I improve my sleep?",
    "What is machine learning?",
    "Explain what a variable is in programming.",
    "Write a Python function that reverses a string.",
    "What causes the seasons on Earth?",
    "Summarize the story of Cinderella in three sentences.",
    "What is the boiling point of water at sea level?",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "What are the planets in our solar system?",
    "How do vaccines work?",
    "Write a short story about a robot who learns to paint.",
    "What is the Pythagorean theorem?",
    "Explain the difference between a list and a tuple in Python.",
    "How do I write a good cover letter?",
    "What is inflation in economics?",
    "Name five animals that live in the desert.",
    "What is the role of the heart in the human body?",
    "Write a limerick about a cat.",
    "How do plants get water from the soil?",
    "What is gravity?",
    "Give me a list of healthy breakfast ideas.",
    "Explain what an API is.",
    "What is the tallest mountain in the world?",
    "How do I calculate the area of a circle?",
    "What are renewable energy sources?",
    "Write an email asking my manager for a day off.",
    "What is the difference between a virus and a bacterium?",
    "How does the internet work?",
    "Describe a sunset over the mountains.",
    "What should I pack for a weekend camping trip?",
    "Explain recursion with an example.",
    "What is democracy?",
    "Why do leaves change color in the fall?",
    "How do I stay motivated when working from home?",
    "What is the speed of light?",
    "Write a thank-you note to a teacher.",
    "What are the main causes of climate change?",
    "How do you say hello in Spanish, French and German?",
    "What is an ecosystem?",
    "Give me a short motivational quote and explain it.",
    "How does a refrigerator keep food cold?",
    "What is a black hole?",
    "Write a SQL query that selects all users older than 30.",
    "What is the difference between 'affect' and 'effect'?",
    "Explain how a rainbow forms.",
    "What are some good habits for saving money?",
    "Describe the life cycle of a butterfly.",
    "What is the function of DNA?",
    "How do I boil an egg?",
    "Write a dialogue between a dog and a cat.",
    "What is the Great Wall of China?",
    "Explain the rules of chess briefly.",
    "What is a noun? Give examples.",
    "How do airplanes stay in the air?",
    "What is the meaning of the word 'resilience'?",
    "List the steps to plant a tree.",
    "What is cloud computing?",
    "Write a JavaScript function that adds two numbers.",
    "What is the largest ocean on Earth?",
    "How can I reduce stress?",
    "What happened during the Renaissance?",
    "Explain supply and demand.",
    "What is a healthy diet?",
    "Write a short speech for a friend's birthday.",
    "How do magnets work?",
    "What are the three states of matter?",
    "How do I tie a tie?",
    "What is the purpose of a museum?",
    "Explain binary numbers.",
    "What is the moon made of?",
    "Write a product description for a reusable water bottle.",
    "What are the symptoms of the common cold?",
    "How does recycling help the environment?",
    "What is a sonnet?",
    "Give me five ideas for a rainy day.",
    "Explain what a computer's CPU does.",
    "What are the benefits of reading books?",
    "How do bees make honey?",
    "What is an atom?",
    "Write a riddle and give its answer.",
    "What is the difference between a lake and a sea?",
    "How do I start learning to play the guitar?",
    "What is the history of the Olympic Games?",
    "Explain what a loop is in programming.",
    "What is kindness?",
    "How do earthquakes happen?",
    "Describe your ideal vacation.",
    "What is a verb? Give three examples.",
    "How do I make a budget?",
    "What is the function of the lungs?",
    "Write a Python list comprehension that squares numbers from 1 to 10.",
    "Why is sleep important for children?",
    "What is a volcano?",
    "Give advice to a student starting university.",
    "What is the difference between RAM and storage?",
    "Tell me about the history of chocolate.",
    "How do fish breathe underwater?",
    "Write a four-line poem about friendship.",
    "What is electricity?",
    "Explain the importance of drinking water.",
    "What are the colors of the rainbow?",
    "How does a search engine find web pages?",
    "Describe a busy city street in the morning.",
    "What is a fraction? Give an example.",
    "How can I be a better listener?",
    "What is the role of a judge?",
    "Explain why we have day and night.",
)

#: Held-out evaluation prompts: disjoint from TRAIN_PROMPTS, never seen in training.
HELDOUT_PROMPTS: tuple[str, ...] = (
    "What is the capital of Japan and what is it known for?",
    "Explain how a battery stores energy.",
    "Write a short poem about winter snow.",
    "How do I make a simple salad?",
    "What are the benefits of learning a second language?",
    "Give me three tips for public speaking.",
    "What is an even number?",
    "Describe how clouds form.",
    "Write a haiku about the morning sun.",
    "How does a car engine work?",
    "Tell me a fun fact about elephants.",
    "What is artificial intelligence?",
    "Write a Python function that checks whether a number is even.",
    "Summarize the story of Little Red Riding Hood.",
    "Why do we have tides?",
    "How do I write a good essay introduction?",
    "What is a mammal? Give examples.",
    "Explain what a database is.",
    "What should I do before a job interview?",
    "How do birds know where to migrate?",
    "Write a short thank-you message to a neighbour.",
    "What is the difference between a star and a planet?",
    "How can I keep my houseplants healthy?",
    "Explain what an algorithm is.",
)


#: Templates and subjects of :func:`synthetic_prompts` (the bulk of the training prompts: combinations,
#: never a held-out prompt; see the disjointness test in tests/drafts).
_TEMPLATES: tuple[str, ...] = (
    "What is {s}?", "Explain {s} in simple terms.", "Give me three facts about {s}.",
    "Write a short paragraph about {s}.", "Why is {s} important?", "Describe {s} to a ten-year-old.",
    "What are the main ideas behind {s}?", "Write a short poem about {s}.", "List five things to know about {s}.",
    "How would you teach someone about {s}?", "Summarize what you know about {s} in two sentences.",
    "What is a common misconception about {s}?", "Write a haiku about {s}.", "Give an example related to {s}.",
    "What questions do people often ask about {s}?", "Compare {s} with something similar.",
    "Write a short story that involves {s}.", "What are the pros and cons of {s}?",
    "How has {s} changed over time?", "Explain {s} step by step.", "Write a tweet about {s}.",
    "What would happen without {s}?", "Give me a quiz question about {s} and its answer.",
    "Write a short dialogue about {s}.",
)
_SUBJECTS: tuple[str, ...] = (
    "the ocean", "volcanoes", "the moon", "rainforests", "electric cars", "the human brain", "honey bees",
    "the printing press", "coffee", "chess", "the Roman Empire", "solar panels", "friendship", "penguins",
    "the stock market", "vaccines", "the piano", "deserts", "gravity", "recycling", "the internet",
    "ancient Egypt", "mountains", "sleep", "bread", "rivers", "dinosaurs", "the French Revolution",
    "spiders", "teamwork", "basketball", "glaciers", "the immune system", "trains", "photography",
    "the alphabet", "tea", "libraries", "whales", "wind energy", "the Renaissance", "robots", "maps",
    "mathematics", "fractions", "Python programming", "sorting algorithms", "linked lists", "HTML",
    "encryption", "spreadsheets", "the water cycle", "earthquakes", "the solar system", "comets",
    "photosynthesis", "bacteria", "the heart", "bones", "music", "painting", "poetry", "gardening",
    "cooking pasta", "saving money", "running", "yoga", "meditation", "time management", "kindness",
    "honesty", "cities", "farming", "bridges", "airplanes", "the telephone", "birds", "cats", "dogs",
    "horses", "forests", "snow", "thunderstorms", "rainbows", "the Olympic Games", "museums", "castles",
    "pirates", "the Great Barrier Reef", "newspapers", "video games", "social media", "clean water",
    "hospitals", "firefighters", "teachers", "the seasons", "clocks", "money", "languages",
)


def synthetic_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct training prompts made from :data:`_TEMPLATES` x :data:`_SUBJECTS` in a seeded
    order, minus any that equals a held-out prompt."""
    def normal(text: str) -> str:
        return " ".join(text.casefold().split())

    held = {normal(p) for p in HELDOUT_PROMPTS + TRAIN_PROMPTS}
    combos = [t.format(s=s) for s in _SUBJECTS for t in _TEMPLATES]
    combos = [c for c in combos if normal(c) not in held]
    order = torch.randperm(len(combos), generator=torch.Generator().manual_seed(seed)).tolist()
    if count > len(combos):
        raise ValueError(f"count must be <= {len(combos)}, got count={count}")
    return [combos[i] for i in order[:count]]


@dataclass
class TeacherData:
    """Teacher-forced target outputs on ``n`` sequences, right-padded to ``L``.

    ``tokens [n, L]`` long, ``lengths [n]``, ``prompt_lengths [n]``, ``features [n, L, H]`` (final normed
    hidden), ``top_ids [n, L, k]`` and ``top_logprobs [n, L, k]`` (the target's next-token law at each
    position, top-k).
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    prompt_lengths: torch.Tensor
    features: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


@dataclass(frozen=True)
class TrainConfig:
    """Sizes and schedule. ``steps`` optimizer steps of ``batch_size`` sequences per draft."""

    max_new_tokens: int = 128
    synthetic_prompts: int = 1400
    samples: int = 0
    gen_batch_size: int = 64
    top_k: int = 32
    vocab_subset: int = 8192
    batch_size: int = 8
    steps_distilled: int = 800
    steps_head: int = 800
    lr_distilled: float = 2e-3
    lr_head: float = 3e-3
    feature_weight: float = 1.0
    seed: int = 0


Progress = Callable[[str, int], Any]


def generate_responses(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    config: TrainConfig,
    progress: Progress | None = None,
) -> list[tuple[list[int], list[int]]]:
    """``(prompt_ids, response_ids)`` for every prompt: greedy, then ``config.samples`` sampled rounds."""
    from spec_fast.models import chat_prompt_ids

    prompt_ids = [chat_prompt_ids(tokenizer, p) for p in prompts]
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    out: list[tuple[list[int], list[int]]] = []
    rounds = [False] + [True] * config.samples
    for r, sample in enumerate(rounds):
        torch.manual_seed(config.seed + 1000 + r)
        for start in range(0, len(prompt_ids), config.gen_batch_size):
            chunk = prompt_ids[start : start + config.gen_batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.long)
            for b, p in enumerate(chunk):  # left padding for generation
                ids[b, width - len(p) :] = torch.tensor(p)
                mask[b, width - len(p) :] = 1
            with torch.no_grad():
                gen = target.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=config.max_new_tokens,
                    do_sample=sample, temperature=0.8 if sample else None, top_p=None, top_k=None,
                    pad_token_id=pad, eos_token_id=eos,
                )
            for b, p in enumerate(chunk):
                response = gen[b, width:].tolist()
                if eos in response:
                    response = response[: response.index(eos) + 1]
                out.append((list(p), [int(t) for t in response]))
            if progress is not None:
                progress("generate", len(chunk))
    return out


@torch.no_grad()
def teacher_forcing(
    target: Any, pairs: Sequence[tuple[list[int], list[int]]], top_k: int = 32, batch_size: int = 8,
    progress: Progress | None = None,
) -> TeacherData:
    """Run the target over every ``prompt + response`` and record features and top-k next-token laws."""
    seqs = [p + r for p, r in pairs]
    n, width = len(seqs), max(len(s) for s in seqs)
    hidden = int(target.config.hidden_size)
    tokens = torch.zeros(n, width, dtype=torch.long)
    lengths = torch.tensor([len(s) for s in seqs])
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
    features = torch.zeros(n, width, hidden)
    top_ids = torch.zeros(n, width, top_k, dtype=torch.long)
    top_logprobs = torch.full((n, width, top_k), -math.inf)
    for start in range(0, n, batch_size):
        sl = slice(start, min(start + batch_size, n))
        w = int(lengths[sl].max())
        mask = (torch.arange(w).unsqueeze(0) < lengths[sl].unsqueeze(1)).long()
        out = target(input_ids=tokens[sl, :w], attention_mask=mask, output_hidden_states=True, use_cache=False)
        features[sl, :w] = out.hidden_states[-1].float()
        logprobs = torch.log_softmax(out.logits.float(), dim=-1)
        vals, ids = torch.topk(logprobs, top_k, dim=-1)
        top_ids[sl, :w] = ids
        top_logprobs[sl, :w] = vals
        if progress is not None:
            progress("teacher", sl.stop - sl.start)
    return TeacherData(tokens, lengths, torch.tensor([len(p) for p, _ in pairs]), features, top_ids, top_logprobs)


def vocabulary_subset(data: TeacherData, size: int, vocab_size: int, special_ids: Sequence[int] = ()) -> torch.Tensor:
    """The ``size`` token ids the drafts score (sorted): special ids, then by frequency in the sequences
    and the teachers' top-4 (ties and the remainder by lowest id)."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    valid = torch.arange(data.tokens.shape[1]).unsqueeze(0) < data.lengths.unsqueeze(1)
    counts.index_add_(0, data.tokens[valid], torch.ones(int(valid.sum()), dtype=torch.float64))
    top4 = data.top_ids[..., :4][valid].reshape(-1)
    counts.index_add_(0, top4, torch.full((top4.numel(),), 0.5, dtype=torch.float64))
    for t in special_ids:
        counts[int(t)] = math.inf
    # stable order: by count desc, then id asc
    order = sorted(range(vocab_size), key=lambda t: (-float(counts[t]), t))
    return torch.tensor(sorted(order[:size]), dtype=torch.long)


def _soft_targets(
    data: TeacherData, rows: torch.Tensor, width: int, index_map: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher laws on the subset: ``ids [b, w, k]`` (subset indices, 0 where outside), ``probs [b, w, k]``
    (renormalised on the subset), ``mask [b, w]`` (valid positions with some mass on the subset)."""
    ids = index_map[data.top_ids[rows, :width]]
    logp = data.top_logprobs[rows, :width]
    inside = ids >= 0
    probs = torch.where(inside, logp.exp(), torch.zeros_like(logp))
    total = probs.sum(-1, keepdim=True)
    probs = probs / total.clamp(min=1e-12)
    # only the positions that predict response tokens (the chat template repeats in every prompt)
    mask = _response_positions(data, rows, width, last=True) & (total.squeeze(-1) > 0.05)
    return ids.clamp(min=0), probs, mask


def _response_positions(data: TeacherData, rows: torch.Tensor, width: int, last: bool) -> torch.Tensor:
    """``[b, width]`` bool: positions whose next token is a response token (from the prompt's last
    position on); with ``last=False`` the sequence's final position (predicting past its end) is left out."""
    position = torch.arange(width).unsqueeze(0)
    end = data.lengths[rows].unsqueeze(1) - (0 if last else 1)
    return (position < end) & (position >= data.prompt_lengths[rows].unsqueeze(1) - 1)


def _unrolled_features(head: FeatureHead, embeds: torch.Tensor, true_feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two drafting steps of a feature head on whole sequences: step 1 reads the true previous
    features ``f_{j-1}``, step 2 the features step 1 predicted one position earlier (detached)."""
    def shifted(feats: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], dim=1)

    g1 = head.features(embeds, shifted(true_feats))
    return g1, head.features(embeds, shifted(g1.detach()))


def _soft_ce(subset_logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logq = torch.log_softmax(subset_logits.float(), dim=-1)
    per_pos = -(probs * torch.gather(logq, -1, ids)).sum(-1)
    return (per_pos * mask).sum() / mask.sum().clamp(min=1)


def _schedule(step: int, steps: int, lr: float, warmup: int = 20) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _optimizer_step(
    optimizer: torch.optim.Optimizer, params: list[nn.Parameter], loss: torch.Tensor, progress: Progress | None,
    label: str,
) -> None:
    """Backward, clip the gradient norm to 1, step; report the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    if progress is not None:
        progress(f"{label} loss {loss.item():.3f}", 1)


def _batches(n: int, batch_size: int, steps: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    batch_size = min(batch_size, n)
    out: list[torch.Tensor] = []
    while len(out) < steps:
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n - batch_size + 1, batch_size):
            out.append(perm[start : start + batch_size])
            if len(out) == steps:
                break
    return out


def _index_map(vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    index_map = torch.full((vocab_size,), -1, dtype=torch.long)
    index_map[vocab_ids] = torch.arange(vocab_ids.numel())
    return index_map


def train_distilled(
    target: Any, data: TeacherData, vocab_ids: torch.Tensor, config: TrainConfig,
    init_layers: tuple[int, ...] = (0,), progress: Progress | None = None,
) -> Any:
    """Train a :func:`~spec_fast.heads.distilled_model` (returns the model, float32, eval mode)."""
    torch.manual_seed(config.seed)
    draft = distilled_model(target, vocab_ids, init_layers)
    params = [p for n, p in draft.named_parameters() if n.startswith(("model.layers.", "model.norm."))]
    shared = {id(p) for p in target.parameters()}
    new_params = []
    for p in params:  # the copies are new tensors; the shared embedding/LM head stay frozen
        assert id(p) not in shared
        p.requires_grad_(True)
        new_params.append(p)
    for n, p in draft.named_parameters():
        if not n.startswith(("model.layers.", "model.norm.")):
            p.requires_grad_(False)
    head: SubsetHead = draft.lm_head
    index_map = _index_map(vocab_ids, head.vocab_size)
    optimizer = torch.optim.AdamW(new_params, lr=config.lr_distilled, weight_decay=0.01)
    draft.train()
    for step, rows in enumerate(_batches(data.tokens.shape[0], config.batch_size, config.steps_distilled, config.seed)):
        width = int(data.lengths[rows].max())
        _set_lr(optimizer, _schedule(step, config.steps_distilled, config.lr_distilled))
        mask2d = (torch.arange(width).unsqueeze(0) < data.lengths[rows].unsqueeze(1)).long()
        hidden = draft.model(input_ids=data.tokens[rows, :width], attention_mask=mask2d, use_cache=False).last_hidden_state
        ids, probs, mask = _soft_targets(data, rows, width, index_map)
        loss = _soft_ce(head.subset_logits(hidden), ids, probs, mask)
        _optimizer_step(optimizer, new_params, loss, progress, "distilled")
    draft.eval()
    for p in draft.parameters():
        p.requires_grad_(False)
    return draft


def train_head(
    target: Any, kind: str, data: TeacherData, vocab_ids: torch.Tensor, config: TrainConfig,
    progress: Progress | None = None,
) -> FeatureHead:
    """Train a :class:`~spec_fast.heads.FeatureHead` of ``kind`` (two unrolled steps, module docstring)."""
    torch.manual_seed(config.seed + (1 if kind == "eagle" else 2))
    head = FeatureHead(target, kind, vocab_ids)
    head.init_from_target(target)
    new_params = [p for n, p in head.named_parameters() if not n.startswith("head.")]
    for n, p in head.named_parameters():
        p.requires_grad_(not n.startswith("head."))
    embed = head.embed[0]
    index_map = _index_map(vocab_ids, head.head.vocab_size)
    optimizer = torch.optim.AdamW(new_params, lr=config.lr_head, weight_decay=0.01)
    head.train()
    for step, rows in enumerate(_batches(data.tokens.shape[0], config.batch_size, config.steps_head, config.seed + 7)):
        width = int(data.lengths[rows].max())
        _set_lr(optimizer, _schedule(step, config.steps_head, config.lr_head))
        with torch.no_grad():
            embeds = embed(data.tokens[rows, :width]).float()
        true_feats = data.features[rows, :width]  # f_j
        ids, probs, mask = _soft_targets(data, rows, width, index_map)
        g1, g2 = _unrolled_features(head, embeds, true_feats)
        m = mask.unsqueeze(-1).float()
        loss = torch.zeros(())
        for weight, g in ((1.0, g1), (0.5, g2)):
            ce = _soft_ce(head.head.subset_logits(g), ids, probs, mask)
            reg = (nn.functional.smooth_l1_loss(g, true_feats, reduction="none") * m).sum() / (m.sum() * g.shape[-1])
            loss = loss + weight * (ce + config.feature_weight * reg)
        _optimizer_step(optimizer, new_params, loss, progress, kind)
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return head


@torch.no_grad()
def heldout_agreement(draft: Any, data: TeacherData, batch_size: int = 8) -> list[float]:
    """Teacher-forced top-1 agreement of a draft with the target on ``data`` (response positions only).

    For a :class:`FeatureHead`: ``[step 1, step 2]``, the fraction of positions where the head's argmax
    equals the target's argmax when it reads the target's true previous feature (step 1, what depth 1 of
    a greedy chain accepts) and when it reads the feature it predicted itself one position earlier
    (step 2, as at depth 2). For a distilled draft model: ``[step 1]``. On the target's own greedy
    responses, step 1 is the expected greedy acceptance rate at depth 1.
    """
    hits = [0.0, 0.0]
    total = 0.0
    for start in range(0, data.tokens.shape[0], batch_size):
        rows = torch.arange(start, min(start + batch_size, data.tokens.shape[0]))
        width = int(data.lengths[rows].max())
        valid = _response_positions(data, rows, width, last=False)
        target_top1 = data.top_ids[rows, :width, 0]
        tokens = data.tokens[rows, :width]
        if isinstance(draft, FeatureHead):
            g1, g2 = _unrolled_features(draft, draft.embed[0](tokens).float(), data.features[rows, :width])
            preds = [draft.head(g1).argmax(-1), draft.head(g2).argmax(-1)]
        else:
            mask = (torch.arange(width).unsqueeze(0) < data.lengths[rows].unsqueeze(1)).long()
            preds = [draft(input_ids=tokens, attention_mask=mask, use_cache=False).logits.argmax(-1)]
        for i, pred in enumerate(preds):
            hits[i] += float(((pred == target_top1) & valid).sum())
        total += float(valid.sum())
    steps = 2 if isinstance(draft, FeatureHead) else 1
    return [h / max(total, 1.0) for h in hits[:steps]]


def save_weights(path: str, tensors: dict[str, torch.Tensor], vocab_ids: torch.Tensor, metadata: dict[str, str]) -> None:
    """Write the new weights (float16) and the vocabulary subset to a safetensors file."""
    from safetensors.torch import save_file

    out = {k: v.detach().to(torch.float16).contiguous() for k, v in tensors.items()}
    out["vocab_ids"] = vocab_ids.to(torch.int32).contiguous()
    save_file(out, path, metadata=metadata)


def elapsed(start: float) -> str:
    return f"{time.perf_counter() - start:.0f}s"
