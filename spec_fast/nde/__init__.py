"""The neural delayed-expansion (NDE) selector wing (seed 002 (docs/papers.md) section 6, appendix E).

- :mod:`spec_fast.nde.proposer`: decoding with the selector, one delayed-tree shape per step
  (:func:`draft_nde`, :class:`NdeSelector`, :func:`load_nde_selector`);
- :mod:`spec_fast.nde.selector`: the selector network and its appendix-E root features;
- :mod:`spec_fast.nde.latency`: the warm-up latency model (eq. 11) measured on the machine in use;
- :mod:`spec_fast.nde.selector_data` and :mod:`spec_fast.nde.selector_training`: the offline dataset and
  the eq. 12 training loop (driven by ``scripts/selector_dataset.py`` and ``scripts/train_selector.py``).

The wing sits above the drafts and below the engine (docs/engine.md, "Layout").
"""

from __future__ import annotations

from spec_fast.nde.proposer import (
    DEFAULT_SELECTOR_WEIGHTS, HiddenRecorder, NdeChoice, NdeSelector, check_nde_drafter, draft_nde, load_nde_selector,
    stored_latency,
)

__all__ = ["HiddenRecorder", "NdeSelector", "NdeChoice", "DEFAULT_SELECTOR_WEIGHTS", "load_nde_selector", "stored_latency",
           "check_nde_drafter", "draft_nde"]
