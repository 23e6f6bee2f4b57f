"""The prompt sets of the trained drafts, read from ``prompts.json`` (package data next to this module).

``TRAIN_PROMPTS`` (hand-written) and :func:`synthetic_prompts` (templates x subjects in a seeded order) are
the training prompts of :mod:`spec_fast.drafts.training`; ``HELDOUT_PROMPTS`` are disjoint from both and
never read by training: they are the evaluation set of ``bench/drafts.py`` and the benchmarks. The lists
keep the file's order, which the seeded training data depends on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import torch

__all__ = ["PromptSets", "parse_prompt_sets", "load_prompt_sets", "TRAIN_PROMPTS", "HELDOUT_PROMPTS",
           "synthetic_prompts", "prompt_grams", "near_duplicate", "DATASTORE_EXCLUDED"]

#: file name of the prompt sets inside the ``spec_fast.drafts`` package
PROMPTS_FILE = "prompts.json"

#: placeholder of the subject in a synthetic template
SUBJECT_FIELD = "{s}"


@dataclass(frozen=True)
class PromptSets:
    """The four prompt lists of ``prompts.json``, in file order."""

    train: tuple[str, ...]
    heldout: tuple[str, ...]
    synthetic_templates: tuple[str, ...]
    synthetic_subjects: tuple[str, ...]


def _strings(data: dict[str, object], key: str) -> tuple[str, ...]:
    value = data.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f"prompt set {key!r} must be a non-empty list of non-empty strings, got {value!r:.80}")
    return tuple(value)


def parse_prompt_sets(data: object) -> PromptSets:
    """Check and convert the decoded JSON object of ``prompts.json``."""
    if not isinstance(data, dict):
        raise ValueError(f"prompt sets must be a JSON object, got {type(data).__name__}")
    sets = PromptSets(
        train=_strings(data, "train"),
        heldout=_strings(data, "heldout"),
        synthetic_templates=_strings(data, "synthetic_templates"),
        synthetic_subjects=_strings(data, "synthetic_subjects"),
    )
    for template in sets.synthetic_templates:
        if SUBJECT_FIELD not in template:
            raise ValueError(f"synthetic template must contain {SUBJECT_FIELD!r}, got template={template!r}")
    return sets


@lru_cache(maxsize=1)
def load_prompt_sets() -> PromptSets:
    """The prompt sets shipped with the package (read once)."""
    text = resources.files("spec_fast.drafts").joinpath(PROMPTS_FILE).read_text(encoding="utf-8")
    return parse_prompt_sets(json.loads(text))


#: Prompts whose target responses are the training data (never used for evaluation).
TRAIN_PROMPTS: tuple[str, ...] = load_prompt_sets().train

#: Held-out evaluation prompts: disjoint from TRAIN_PROMPTS, never seen in training.
HELDOUT_PROMPTS: tuple[str, ...] = load_prompt_sets().heldout


def _normal(text: str) -> str:
    return " ".join(text.casefold().split())


def synthetic_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct training prompts made from the synthetic templates x subjects in a seeded order,
    minus any that equals a held-out or hand-written training prompt."""
    sets = load_prompt_sets()
    held = {_normal(p) for p in sets.heldout + sets.train}
    combos = [t.format(s=s) for s in sets.synthetic_subjects for t in sets.synthetic_templates]
    combos = [c for c in combos if _normal(c) not in held]
    order = torch.randperm(len(combos), generator=torch.Generator().manual_seed(seed)).tolist()
    if count > len(combos):
        raise ValueError(f"count must be <= {len(combos)}, got count={count}")
    return [combos[i] for i in order[:count]]


#: function words left out of :func:`prompt_grams` (what a prompt asks about is in its other words)
_FUNCTION_WORDS = frozenset(
    "a an the of to in on and or is are was what how why do does did i me my for with about that this it be can "
    "you your as at by from into over than then there these those which who whom whose will would should could "
    "give tell explain write describe".split())


@lru_cache(maxsize=16384)
def prompt_grams(text: str) -> frozenset[tuple[str, ...]]:
    """The word 1- and 2-grams of a prompt's content words: casefolded, function words left out, a plural
    ``s`` stripped from words longer than three letters."""
    words = [w[:-1] if len(w) > 3 and w.endswith("s") else w
             for w in re.findall(r"[a-z0-9]+", text.casefold()) if w not in _FUNCTION_WORDS]
    return frozenset({(w,) for w in words} | {(a, b) for a, b in zip(words, words[1:])})


def near_duplicate(first: str, second: str) -> bool:
    """Whether two prompts are near-paraphrases by n-gram overlap (:func:`prompt_grams`): a Jaccard index of
    at least 0.45, or the smaller set (three grams or more) at least 75 % inside the other.

    Calibrated on the benchmark and training prompts (tests/drafts/test_prompt_hygiene.py): it flags
    "Write a short poem about winter snow." against "Write a short poem about snow." and "Why is the sky
    blue? Answer briefly." against "Why is the sky blue?", and not prompts that share only a synthetic
    template ("Write a short poem about the sea." against "... about mathematics.")."""
    a, b = prompt_grams(first), prompt_grams(second)
    if not a or not b:
        return False
    shared = len(a & b)
    small = min(len(a), len(b))
    return shared / len(a | b) >= 0.45 or (small >= 3 and shared / small >= 0.75)


#: Training prompts whose answers are left out of the retrieval datastore (spec_fast/weights/datastore.npz):
#: each is a :func:`near_duplicate` of a benchmark prompt (tests/drafts/test_prompt_hygiene.py finds them).
#: The trained drafts (``rnn``, ``eagle``, ``distilled``) were trained before this list existed and still
#: saw them; that test lists those pairs.
DATASTORE_EXCLUDED: tuple[str, ...] = (
    "Write a short poem about the sea.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "What should I pack for a weekend camping trip?",
    "What is photosynthesis?",
    "What is a prime number?",
    "What is machine learning?",
    "What is the Pythagorean theorem?",
    "Write a short poem about snow.",
)
