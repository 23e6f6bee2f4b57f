"""The drafts of the engine, in one place.

- :mod:`spec_fast.drafts.model`: the :class:`Drafter` protocol, a small draft model (:class:`ModelDrafter`)
  and the early-exit draft that shares the target's first layers (:class:`EarlyExitDrafter`);
- :mod:`spec_fast.drafts.heads`: the committed trained drafts (distilled model, eagle and rnn feature heads);
- :mod:`spec_fast.drafts.retrieval`: model-free drafting from a suffix index and the row's own text;
- :mod:`spec_fast.drafts.dual`: two drafters merged into one tree or routed (:class:`DualDrafter`);
- :mod:`spec_fast.drafts.prompts`: the training and held-out prompt sets (``prompts.json``).

:mod:`spec_fast.drafts.training` (distillation, driven by ``scripts/train_drafts.py``) is not exported here
and no runtime module imports it. Names are imported on first use, as in :mod:`spec_fast`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec_fast._lazy import lazy_exports

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Drafter": "spec_fast.drafts.model",
    "EarlyExitDrafter": "spec_fast.drafts.model",
    "ModelDrafter": "spec_fast.drafts.model",
    "early_exit_model": "spec_fast.drafts.model",
    "DRAFT_NAMES": "spec_fast.drafts.heads",
    "DRAFTER_NAMES": "spec_fast.drafts.heads",
    "WEIGHTS_DIR": "spec_fast.drafts.heads",
    "FeatureHead": "spec_fast.drafts.heads",
    "SubsetHead": "spec_fast.drafts.subset_head",
    "HeadDrafter": "spec_fast.drafts.heads",
    "distilled_model": "spec_fast.drafts.heads",
    "load_distilled": "spec_fast.drafts.heads",
    "load_drafter": "spec_fast.drafts.heads",
    "load_head": "spec_fast.drafts.heads",
    "weights_path": "spec_fast.drafts.heads",
    "DATASTORE_PATH": "spec_fast.drafts.retrieval",
    "HybridDrafter": "spec_fast.drafts.hybrid",
    "RetrievalDrafter": "spec_fast.drafts.retrieval",
    "SuffixIndex": "spec_fast.drafts.retrieval",
    "load_retrieval_drafter": "spec_fast.drafts.retrieval",
    "DUAL_MODES": "spec_fast.drafts.dual",
    "DualDraft": "spec_fast.drafts.dual",
    "DualDrafter": "spec_fast.drafts.dual",
    "HELDOUT_PROMPTS": "spec_fast.drafts.prompts",
    "TRAIN_PROMPTS": "spec_fast.drafts.prompts",
    "synthetic_prompts": "spec_fast.drafts.prompts",
}

__all__ = ["Drafter", "EarlyExitDrafter", "ModelDrafter", "early_exit_model", "DRAFT_NAMES", "DRAFTER_NAMES",
           "WEIGHTS_DIR", "FeatureHead", "SubsetHead", "HeadDrafter", "distilled_model", "load_distilled",
           "load_drafter", "load_head", "weights_path", "DATASTORE_PATH", "HybridDrafter", "RetrievalDrafter",
           "SuffixIndex", "load_retrieval_drafter", "DUAL_MODES", "DualDraft", "DualDrafter", "HELDOUT_PROMPTS",
           "TRAIN_PROMPTS", "synthetic_prompts"]


__getattr__, __dir__ = lazy_exports("spec_fast.drafts", _EXPORTS, globals())


if TYPE_CHECKING:
    from spec_fast.drafts.dual import DUAL_MODES, DualDraft, DualDrafter
    from spec_fast.drafts.heads import (DRAFT_NAMES, DRAFTER_NAMES, WEIGHTS_DIR, FeatureHead, HeadDrafter,
                                        distilled_model, load_distilled, load_drafter, load_head, weights_path)
    from spec_fast.drafts.model import Drafter, EarlyExitDrafter, ModelDrafter, early_exit_model
    from spec_fast.drafts.prompts import HELDOUT_PROMPTS, TRAIN_PROMPTS, synthetic_prompts
    from spec_fast.drafts.subset_head import SubsetHead
    from spec_fast.drafts.hybrid import HybridDrafter
    from spec_fast.drafts.retrieval import DATASTORE_PATH, RetrievalDrafter, SuffixIndex, load_retrieval_drafter
