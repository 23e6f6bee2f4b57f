"""The drafts: prompt sets of the trained drafts (:mod:`spec_fast.drafts.prompts`)."""

from __future__ import annotations
