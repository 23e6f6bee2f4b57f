"""Hugging Face transformers' ``_speculative_sampling``, imported and called as shipped (not ported).

``huggingface/transformers``, ``src/transformers/generation/utils.py``, ``_speculative_sampling`` (checked with
the installed transformers; the report records its version). It implements Algorithm 1 of arXiv 2211.17192
on one drafted chain: accept draft i while ``r_i <= p_i(x_i) / q_i(x_i)``, then draw the next token from
``(p - q)+`` normalised at the first rejection, or from the target's last row after a full match. With
``assistant_ensemble_weight = w`` in (0, 1) it verifies against ``v = w p + (1 - w) q`` instead (static
ensemble verification, DIVERSE, arXiv 2604.07622 as its docstring cites it), which trades the target's law
for acceptance by design.

The adapter hands it ``log`` of the kit's probability rows as logits (its softmax gives the rows back; a
0 becomes a masked ``-inf`` logit) and the drafts as candidate ids. Its randomness is torch's global
generator (``torch.rand_like``, ``torch.multinomial``), which cannot be enumerated: the check is statistical,
and :func:`seed_torch` seeds that generator before each run so the verdict is reproducible.
:func:`ensemble_transcription` is a transcription of the ensemble rule in the spec_ref RNG protocol, used only
to measure exactly how far the shipped ensemble option is from the target (the negative control's
certificate: its worst-case total variation must reach the total variation the statistical check's power is
stated at).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from conformance._common import categorical, positive_part

__all__ = ["ensemble_transcription", "seed_torch", "speculative_sampling", "transformers_version"]

ChainVerifier = Callable[[Any, Any, tuple[int, ...], Any], list[int]]


def _modules() -> tuple[Any, Any]:
    torch = importlib.import_module("torch")
    utils = importlib.import_module("transformers.generation.utils")
    return torch, utils


def transformers_version() -> str:
    return str(importlib.import_module("transformers").__version__)


def seed_torch(seed: int) -> None:
    """Seed torch's global generator, the one ``_speculative_sampling`` draws from, and use one thread.

    The tensors are tiny ([1, 3, 3]); torch's default thread pool made each call several times slower on a
    shared 2-core machine (as bench/results/threads.md found for decoding).
    """
    torch, _ = _modules()
    torch.set_num_threads(1)
    torch.manual_seed(seed)


def speculative_sampling(ensemble_weight: float | None = None) -> ChainVerifier:
    """The kit adapter around transformers' own ``_speculative_sampling`` (``rng`` is unused)."""
    torch, utils = _modules()
    shipped = utils._speculative_sampling
    options = {} if ensemble_weight is None else {"assistant_ensemble_weight": ensemble_weight}

    def verifier(target_probs: Any, draft_probs: Any, draft_tokens: tuple[int, ...], rng: Any) -> list[int]:
        with np.errstate(divide="ignore"):  # log 0 = -inf: a masked logit
            new_logits = torch.from_numpy(np.log(np.asarray(target_probs, dtype=np.float64)))[None]
            candidate_logits = torch.from_numpy(np.log(np.asarray(draft_probs, dtype=np.float64)))[None]
        candidate_ids = torch.tensor([list(draft_tokens)])
        tokens, _ = shipped(candidate_ids, candidate_logits, len(draft_tokens), new_logits, **options)
        return [int(t) for t in tokens[0].tolist()]

    suffix = "" if ensemble_weight is None else f", assistant_ensemble_weight={ensemble_weight}"
    verifier.__qualname__ = f"transformers._speculative_sampling(as shipped{suffix})"
    return verifier


def ensemble_transcription(weight: Fraction) -> ChainVerifier:
    """The ensemble rule in the spec_ref RNG protocol (exact mode): accept while ``u < 1 - w + w p/q``."""

    def verifier(target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], rng: Any) -> list[int]:
        committed: list[int] = []
        for i, x in enumerate(draft_tokens):
            p, q = list(target_probs[i]), list(draft_probs[i])
            if rng.uniform() < 1 - weight + weight * p[x] / q[x]:
                committed.append(int(x))
                continue
            residual = positive_part(p, q)
            return committed + [categorical(rng, residual if sum(residual) > 0 else p)]
        return committed + [categorical(rng, list(target_probs[len(draft_tokens)]))]

    verifier.__qualname__ = f"ensemble_transcription({weight})"
    return verifier
