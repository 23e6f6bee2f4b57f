"""The decoding engine: the step loop, the per-request state, continuous batching and the commit.

- :mod:`spec_fast.engine.decoder`: :class:`SpeculativeDecoder`, one step = draft, target pass, verify,
  commit, batched over requests;
- :mod:`spec_fast.engine.decode_state`: :class:`DecodeState`, everything one running batch changes;
- :mod:`spec_fast.engine.batch_engine`: :class:`BatchEngine`, requests that join and leave a running batch;
- :mod:`spec_fast.engine.proposers`: the one map from a strategy to its proposer;
- :mod:`spec_fast.engine.step_verify`, :mod:`spec_fast.engine.commit`, :mod:`spec_fast.engine.prefill`: the
  verify, commit and prefill phases; :mod:`spec_fast.engine.batch_depth` and :mod:`spec_fast.engine.adaptive`:
  the draft depth chosen from the batch's pass cost, and the greedy speed controller.

The engine is the top floor below the front door (docs/engine.md, "Layout").
"""

from __future__ import annotations

from spec_fast.decoding import SamplingParams
from spec_fast.drafts.batch import HeadTrack
from spec_fast.engine.decode_state import DecodeState
from spec_fast.engine.decoder import GenerationResult, SpeculativeDecoder

__all__ = ["SamplingParams", "GenerationResult", "SpeculativeDecoder", "DecodeState", "HeadTrack"]
