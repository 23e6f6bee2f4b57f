"""Hugging Face transformers' assisted-generation sampler through the README's adapter (``pytest -m statistical``).

``_speculative_sampling`` draws from torch's global generator, so the check is statistical: a chi-square per
case at alpha = 1e-6 for the whole check, sample sizes for power 0.99 against total variation >= 0.2 (the
README's settings).
Negative control: the same adapter with the target and draft logits swapped (the ratio upside down and the
residual (q - p)+). Its exact law, from a spec_ref-protocol transcription of exactly that computation, is at
TV >= 0.2 on some case, which certifies the stated power against it, and the same statistical check must
reject it. Skipped where torch or transformers is not installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from spec_ref._sampling import residual
from spec_ref.testing import check_chain_verifier
from tests.oracle.readme import section_code_blocks
from tests.oracle.verifiers import chain_from_step

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.statistical
TV = 0.2
SIZES: dict[str, Any] = {"vocab_size": 3, "draft_length": 2}


@pytest.fixture(scope="module")
def adapter() -> Any:
    namespace: dict[str, Any] = {"__name__": "readme"}
    source = section_code_blocks()[1]
    definition = source[: source.index("assert_chain_verifier(hf_assisted_sampler")]
    exec(compile(definition, "README.md (transformers adapter)", "exec"), namespace)
    return namespace["hf_assisted_sampler"]


def test_transformers_speculative_sampling_passes_the_chain_check_as_the_readme_runs_it() -> None:
    torch.set_num_threads(1)
    source = section_code_blocks()[1]
    assert f'mode="statistical", tv={TV})' in source  # the same settings as the negative control below
    exec(compile(source, "README.md (transformers adapter)", "exec"), {"__name__": "readme"})


def swapped_step(p: Any, q: Any, drafts: Sequence[int], rng: Any) -> int:
    """What the adapter computes with p and q swapped: accept iff u < q(x)/p(x), else draw from (q - p)+."""
    x = drafts[0]
    if rng.uniform() * p[x] < q[x]:
        return x
    return int(rng.categorical(residual(np.asarray(q), np.asarray(p))))


def test_the_same_check_rejects_the_adapter_with_target_and_draft_swapped(adapter: Any) -> None:
    torch.set_num_threads(1)

    def swapped(target_probs: Any, draft_probs: Any, draft_tokens: tuple[int, ...], rng: Any) -> Any:
        length = len(draft_tokens)
        as_draft = target_probs[:length]
        as_target = np.concatenate([draft_probs, target_probs[length:]])
        return adapter(as_target, as_draft, draft_tokens, rng)

    exact = check_chain_verifier(chain_from_step(swapped_step), **SIZES)
    assert exact.worst.total_variation >= TV, str(exact)
    report = check_chain_verifier(swapped, **SIZES, mode="statistical", tv=TV)
    assert not report.lossless, str(report)
