"""The prompt sets of the trained drafts, read from ``prompts.json`` (package data next to this module).

``TRAIN_PROMPTS`` (hand-written) and :func:`synthetic_prompts` (templates x subjects in a seeded order) are
the training prompts of :mod:`spec_fast.drafts.training`; ``HELDOUT_PROMPTS`` are disjoint from both and
never read by training: they are the evaluation set of ``bench/drafts.py`` and the benchmarks. The lists
keep the file's order, which the seeded training data depends on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import torch

__all__ = ["PromptSets", "parse_prompt_sets", "load_prompt_sets", "TRAIN_PROMPTS", "HELDOUT_PROMPTS",
           "synthetic_prompts"]

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
