"""Host-device synchronisations per decoding step, counted by wrapping the tensor methods that read device
values on the host (``item``, ``tolist``, ``__bool__``, ``__int__``, ``__float__``, ``__index__``).

Budget per step (chain draft, one model drafter): one read-back of the step's small tensors by the engine
(accepted path, next tokens, entries) and one size read per KV-cache commit (target and draft) = 3. A
top-k tree adds two reads per drafted level (the frontier's ranked tokens); a dual draft of two chains adds
the second head's commit read, and a routed one a read per level at most (whether the head drafted second
can still win). A plain step reads its next tokens once. On CPU these are cheap; on an accelerator they are
the points where the host waits, so the test pins them (docs/testing.md: measured, not timed)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import spec_fast.rng as rng_module
from spec_fast.drafts.model import EarlyExitDrafter, ModelDrafter
from spec_fast.drafts.dual import DualDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.strategies import parse_strategy
from tests.engine.models import tiny_llama

TARGET = tiny_llama(vocab_size=32, seed=21)
DRAFT = tiny_llama(vocab_size=32, layers=1, seed=4)
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


@contextmanager
def counting_reads() -> Iterator[list[int]]:
    count = [0]
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(original: Any) -> Any:
        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return original(self, *args, **kwargs)

        return counted

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, wrap(original))
        yield count
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def _reads_per_step(decoder: SpeculativeDecoder, new_tokens: int) -> float:
    """Mean reads of a decoding step, over the steps between a run's first (whose rows are fresh from the
    prefill) and its last (a plain step where one token is left: one read, spec_fast/engine/plain_step.py)."""
    prompts = [[1, 2, 3], [4, 5, 6]]  # same length: the draft caches stay unpadded
    per_step: list[int] = []
    step = decoder.step

    def counted(st: Any) -> list[list[int]]:
        with counting_reads() as count:
            out = step(st)
        per_step.append(count[0])
        return out

    decoder.step = counted  # type: ignore[method-assign]
    try:
        decoder.generate(prompts, max_new_tokens=new_tokens)
    finally:
        del decoder.step
    middle = per_step[1:-1]
    assert len(middle) >= 3
    return sum(middle) / len(middle)


@pytest.mark.parametrize("strategy,drafter,budget", [
    ("ar", None, 1),  # the next tokens (a plain step's shortcut commits without a read)
    ("chain:3", "model", 3),
    ("topk:3,2,5", "model", 3 + 2 * 3),
    ("iid:2x3", "model", 7),  # per-row tree building reads the draws once per level: 5.8 measured
    ("chain:3", "dual", 4),  # read-back, 3 commits: the heads' top-1 chains are drafted on the device
    ("chain:3", "dual-route", 4 + 2),  # and at most one read per level but the last: can head 2 still win?
])
def test_host_reads_per_step_stay_within_the_documented_budget(monkeypatch: pytest.MonkeyPatch, strategy: str,
                                                               drafter: str | None, budget: int) -> None:
    # the device path's reads: a few counters on the CPU are hashed in Python integers after reading their
    # keys (spec_fast/rng.py), a path no accelerator takes
    monkeypatch.setattr(rng_module, "HOST_COUNTERS", 0)
    made: Any = None
    if drafter == "model":
        made = ModelDrafter(DRAFT)
    elif drafter in ("dual", "dual-route"):
        made = DualDrafter(ModelDrafter(DRAFT), EarlyExitDrafter(TARGET, 1), "merge" if drafter == "dual" else "route")
    per_step = _reads_per_step(SpeculativeDecoder(TARGET, made, parse_strategy(strategy)), 16)
    print(f"{strategy} {drafter}: {per_step:.2f} host reads per step")
    assert per_step <= budget
