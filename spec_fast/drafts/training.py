"""Distillation of the drafts in :mod:`spec_fast.drafts.heads` from the target, on CPU, by our own code.

Pipeline (:func:`train_all`, driven by ``scripts/train_drafts.py``):

1. **data**: the target's own responses to the training prompts of :mod:`spec_fast.drafts.prompts` (chat
   template): one greedy response and ``samples`` sampled responses (temperature 0.8, fixed torch seed)
   per prompt, batched HF ``generate``.
2. **teacher forcing**: one target pass per sequence (prompt + response) records, at every position, the
   final normed hidden state (the feature the LM head reads) and the target's top-``k`` next-token
   log-probabilities.
3. **vocabulary subset**: the ``S`` most frequent tokens of the sequences and of the teachers' top-4.
4. **training** (AdamW, cosine schedule, fixed seed, sequence batches in a seeded order):
   ``distilled`` minimises the soft cross-entropy against the teacher's top-k distribution (renormalised
   on the subset); the heads minimise the same loss plus a smooth-L1 feature regression, on two unrolled
   steps (step 1 reads the true previous features, step 2 the features step 1 predicted, as in drafting).

The held-out prompts (:data:`spec_fast.drafts.prompts.HELDOUT_PROMPTS`) are never used here; they are the
evaluation set of ``bench/drafts.py``.
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

from spec_fast.drafts.heads import FeatureHead, SubsetHead, distilled_model, distilled_state

__all__ = [
    "TeacherData", "TrainConfig", "generate_responses", "teacher_forcing",
    "vocabulary_subset", "train_distilled", "train_head", "heldout_agreement", "save_weights",
]


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
    from spec_fast.chat import chat_prompt_ids

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
    """Train a :func:`~spec_fast.drafts.heads.distilled_model` (returns the model, float32, eval mode)."""
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
    """Train a :class:`~spec_fast.drafts.heads.FeatureHead` of ``kind`` (two unrolled steps, module docstring)."""
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
