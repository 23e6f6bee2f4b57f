"""Speculation that knows the batch: each step's draft depth from the batch's size and a measured step cost.

Speculative decoding pays while a target pass is memory-bound (reading the weights dominates, so a few
more tokens per row cost little) and loses once the batch already fills the pass, or once drafting and
verification cost more than the extra tokens save. :class:`PassCost` holds measured seconds by ``rows`` and
``tokens`` entries per row: of one target pass (:func:`measure_pass_cost`: the engine's own cache, behind a
context of ``context`` tokens, the median of a few timed passes) or, what the engine's cost policy reads,
of one whole decoding step at draft depth ``tokens - 1`` (:func:`measure_step_cost`: drafting, the pass,
verification and the commit, measured once per decoder and thread count). Each step, :func:`choose_depth`
picks the depth ``d`` in ``0 .. max depth`` that maximises the expected tokens per second of the whole batch,

    rows * E_d / cost(rows, d + 1),    E_d = 1 + sum_{k=1..d} prod_{j=1..k} a_j,

where ``a_j`` is the batch's recent acceptance rate at depth ``j`` (accepted / reached over the steps of this
running batch, each step's counts shrunk by ``EVIDENCE_DECAY`` at every later step (:class:`DepthEvidence`),
with ``PRIOR_WEIGHT`` pseudo-steps at ``PRIOR_ACCEPTANCE``); ``d = 0`` is a plain step, and a depth ``d > 0``
is taken only where it promises ``DRAFT_MARGIN`` more than plain steps. The choice is made before any draw of the step and is a function of the measured table and the
batch's committed history only, so the output law of every request is the target's and a seeded run is
reproducible for the same arrival schedule and table (docs/engine.md section 10). Steps are timed with
greedy rows: a sampled step's verification costs more than the table says.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_fast.decoding import SamplingParams
from spec_fast.kv_cache import TreeKVCache

__all__ = ["DepthEvidence", "PassCost", "measure_pass_cost", "measure_step_cost", "measured_depths", "choose_depth",
           "DRAFT_MARGIN", "EVIDENCE_DECAY", "PRIOR_ACCEPTANCE", "PRIOR_WEIGHT", "WARM_STEPS", "BLOCK_STEPS",
           "TIMED_ROWS"]

#: acceptance assumed at a depth before the batch has reached it (as pseudo-steps of this weight)
PRIOR_ACCEPTANCE = 0.5
PRIOR_WEIGHT = 4.0
#: the share of throughput over plain steps a drafting depth must promise: a point of the step table moves by
#: about a tenth between two measurements on this machine, so a smaller promised gain was as likely a loss
#: (bench/results/batch.md as committed at c03fa10: drafting at 2 rows on a promised gain of about a tenth
#: decoded 0.86x plain)
DRAFT_MARGIN = 0.1
#: the weight a step's acceptance counts keep at each later step. With counts that never fade, a depth the
#: policy stopped drafting kept the estimate that stopped it, and a text whose drafts start paying later was
#: decoded plain to its end; fading, the prior's pull returns and the depth is tried again after a few steps.
EVIDENCE_DECAY = 0.9


@dataclass
class DepthEvidence:
    """The acceptance counts :func:`choose_depth` reads for a running batch, kept per row: ``rows_reached[b][j]``
    / ``rows_accepted[b][j]`` steps of row ``b`` whose tree reached / accepted depth ``j + 1`` (as
    :meth:`~spec_fast.metrics.GenerationMetrics.record_step` counts them), every count shrunk by
    ``EVIDENCE_DECAY`` at each later step. The batch's counts (:attr:`reached`, :attr:`accepted`) are their
    sums over the rows, so they describe the requests that are in the batch: a request's evidence leaves with
    it and a joining request brings none."""

    rows_reached: list[list[float]] = field(default_factory=list)
    rows_accepted: list[list[float]] = field(default_factory=list)

    @property
    def reached(self) -> list[float]:
        return _column_sums(self.rows_reached)

    @property
    def accepted(self) -> list[float]:
        return _column_sums(self.rows_accepted)

    def fade(self) -> None:
        """One step later: every count shrinks by ``EVIDENCE_DECAY``."""
        for counts in (*self.rows_reached, *self.rows_accepted):
            for j, value in enumerate(counts):
                counts[j] = value * EVIDENCE_DECAY

    def record(self, row: int, depth: int, accepted: int) -> None:
        """Row ``row``'s drafted step: a tree of depth ``depth``, ``accepted`` of its levels accepted."""
        reached, hits = self._row(row, depth)
        for d in range(depth):
            reached[d] += 1
            if d < accepted:
                hits[d] += 1

    def take_rows(self, rows: Sequence[int]) -> None:
        """Keep the counts of rows ``rows`` (in that order), as the batch keeps its rows."""
        self._row(max(rows, default=-1), 0)
        self.rows_reached = [self.rows_reached[b] for b in rows]
        self.rows_accepted = [self.rows_accepted[b] for b in rows]

    def join(self, other: DepthEvidence, own_rows: int, joining_rows: int) -> None:
        """Rows ``own_rows ..`` are ``other``'s ``joining_rows`` rows (a batch they joined)."""
        self._row(own_rows - 1, 0)
        other._row(joining_rows - 1, 0)
        self.rows_reached = self.rows_reached[:own_rows] + other.rows_reached[:joining_rows]
        self.rows_accepted = self.rows_accepted[:own_rows] + other.rows_accepted[:joining_rows]

    def _row(self, row: int, depth: int) -> tuple[list[float], list[float]]:
        """Row ``row``'s counts, holding at least ``depth`` depths (rows and depths added as zeros)."""
        while len(self.rows_reached) <= row:
            self.rows_reached.append([])
            self.rows_accepted.append([])
        if row < 0:
            return [], []
        reached, hits = self.rows_reached[row], self.rows_accepted[row]
        while len(reached) < depth:
            reached.append(0.0)
            hits.append(0.0)
        return reached, hits


def _column_sums(rows: list[list[float]]) -> list[float]:
    sums = [0.0] * max((len(r) for r in rows), default=0)
    for counts in rows:
        for j, value in enumerate(counts):
            sums[j] += value
    return sums


@dataclass(frozen=True)
class PassCost:
    """``seconds[(rows, tokens)]``: one target pass over ``rows`` rows of ``tokens`` entries each."""

    seconds: dict[tuple[int, int], float]

    def __call__(self, rows: int, tokens: int) -> float:
        """The cost at ``(rows, tokens)``: the measured point, else the nearest measured row count above
        (below when none), scaled linearly in rows; between two measured ``tokens`` the straight line between
        them, beyond the widest the widest."""
        row_counts = sorted({r for r, _ in self.seconds})
        above = [r for r in row_counts if r >= rows]
        base = above[0] if above else row_counts[-1]
        scale = rows / base if not above else 1.0
        widths = sorted(t for r, t in self.seconds if r == base)
        width = min(tokens, widths[-1])
        upper = min(t for t in widths if t >= width)
        lower = max((t for t in widths if t <= width), default=upper)
        if lower == upper:
            return self.seconds[(base, upper)] * scale
        low, high = self.seconds[(base, lower)], self.seconds[(base, upper)]
        return (low + (high - low) * (width - lower) / (upper - lower)) * scale


#: the row counts whose steps (and passes) the cost tables time; a table scales its largest beyond it
TIMED_ROWS = (1, 2, 4, 8)


def measure_pass_cost(target: Any, device: torch.device, rows: Sequence[int] = TIMED_ROWS,
                      tokens: Sequence[int] = (1, 2, 3, 4, 5), context: int = 64, repeats: int = 3,
                      tree: bool = False) -> PassCost:
    """Time target passes of ``rows x tokens`` chain entries behind ``context`` committed tokens (module
    docstring); each point is the median of ``repeats`` passes after one untimed warm-up pass. ``tree``:
    the entries form a binary tree in breadth-first order instead (entry i below entry (i - 1) // 2), the
    masked attention path of a tree step."""
    vocab = int(target.get_output_embeddings().weight.shape[0])
    generator = torch.Generator().manual_seed(0)
    seconds: dict[tuple[int, int], float] = {}
    with torch.no_grad():
        for batch in rows:
            cache = TreeKVCache(target, batch, device)
            prompt = torch.randint(0, vocab, (batch, context), generator=generator).to(device)
            chain = torch.arange(-1, context - 1, device=device).expand(batch, context)
            cache.forward(prompt, chain, logits_to_keep=1)
            cache.commit(torch.arange(context, device=device).expand(batch, context),
                         torch.full((batch,), context, dtype=torch.long, device=device), True)
            for width in tokens:
                block = torch.randint(0, vocab, (batch, width), generator=generator).to(device)
                index = torch.arange(width, device=device)
                parents = ((index - 1) // 2 if tree else index - 1).clamp(min=-1).expand(batch, width)
                times = []
                for repeat in range(repeats + 1):
                    start = time.perf_counter()
                    cache.forward(block, parents)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    if repeat > 0:
                        times.append(time.perf_counter() - start)
                    cache.commit(torch.zeros(batch, 1, dtype=torch.long, device=device),
                                 torch.zeros(batch, dtype=torch.long, device=device), True)
                seconds[(batch, width)] = statistics.median(times)
    return PassCost(seconds)


def forcing(depth: int, max_depth: int) -> PassCost:
    """A table under which :func:`choose_depth` picks ``depth`` at any row count and history (every other
    width costs far more): how :func:`measure_step_cost` steps a decoder at a given depth."""
    return PassCost({(1, t): 1.0 if t == depth + 1 else 1e30 for t in range(1, max_depth + 2)})


#: untimed rounds of steps at every depth before :func:`measure_step_cost` times any. Timed depth by depth,
#: depth 0 first on a fresh state, the table put a chain:1 step at 1.05-1.2x a plain one at 1 row where
#: 10-step blocks of real decoding measured 1.33x, and the policy drafted where that did not pay
WARM_STEPS = 2
#: steps a depth runs in a row in each round of :func:`measure_step_cost`, the first of them untimed (decoding
#: at a settled depth pays no change of depth). Taking turns step by step, the table read 1.19-1.26x for a
#: chain:1 step at 1 row; in runs of 3 it reads 1.28-1.30x (scratch, 1 thread), nearer the 1.35x of decoding
#: one request at a fixed depth against plain decoding (bench/results/batch.md as committed at b56996f)
BLOCK_STEPS = 3


def measured_depths(max_depth: int) -> list[int]:
    """The draft depths :func:`measure_step_cost` times: every one up to 4, then 6, 8, 12, 16, ... and
    ``max_depth`` (:class:`PassCost` draws the straight line between them). Every depth of ``chain:8`` took 30 s
    to time at 1-8 rows on one Zen 4 thread against 12 s for ``chain:4``'s (scratch runs); a step's cost grows
    about linearly with its width there (bench/results/pass_width_shared/pass_width.md)."""
    spaced = sorted({m for k in range(2, max(2, max_depth.bit_length()) + 1) for m in (1 << k, 3 << (k - 1))})
    depths = list(range(min(max_depth, 4) + 1)) + [m for m in spaced if 4 < m < max_depth]
    return depths if depths[-1] == max_depth else [*depths, max_depth]


def measure_step_cost(decoder: Any, max_depth: int, rows: Sequence[int] = TIMED_ROWS, context: int = 64,
                      repeats: int = 5) -> PassCost:
    """Seconds of one whole step of ``decoder`` (a :class:`~spec_fast.engine.decoder.SpeculativeDecoder`:
    drafting, the target pass, verification and the commit) over ``rows`` greedy rows behind ``context``
    prompt tokens, at each draft depth of :func:`measured_depths`, keyed ``(rows, depth + 1)``; each point is the
    median of the timed steps of ``repeats`` rounds. In a round every depth runs ``BLOCK_STEPS`` steps in a
    row, the first untimed (it pays for the change of depth, which decoding at a settled depth does not),
    in increasing order of depth and decreasing in the next round; ``WARM_STEPS`` untimed rounds come first.
    So a slow phase of the machine, or the state's growth, weighs on every depth alike. The pass table
    alone leaves out what drafting and verification add to a step, so a policy reading it drafts where that
    does not pay. Each prompt is a random
    run of tokens said twice, so that a drafter that copies from the context (retrieval) finds continuations
    there and its drafts are accepted about as often as on real text: behind random tokens alone they were
    almost never accepted, and the timed steps left out what committing an accepted draft costs. The steps
    run on a throwaway state without the decoder's ``+adaptive`` controller, which they would otherwise
    teach."""
    target = decoder.target
    vocab = int(target.get_output_embeddings().weight.shape[0])
    generator = torch.Generator().manual_seed(0)
    seconds: dict[tuple[int, int], float] = {}
    with torch.no_grad():
        for batch in rows:
            run = torch.randint(0, vocab, (batch, (context + 1) // 2), generator=generator)
            prompts = torch.cat([run, run], dim=1)[:, :context].tolist()
            state = decoder.begin(prompts, [1 << 30] * batch, [SamplingParams()] * batch, list(range(batch)), set())
            state.controller = None
            measured = measured_depths(max_depth)
            times: dict[int, list[float]] = {depth: [] for depth in measured}
            for repeat in range(repeats + WARM_STEPS):
                depths = measured if repeat % 2 == 0 else measured[::-1]
                for depth in depths:
                    state.step_cost = forcing(depth, max_depth)
                    for block_step in range(BLOCK_STEPS):
                        start = time.perf_counter()
                        decoder.step(state)
                        if decoder.device.type == "cuda":
                            torch.cuda.synchronize(decoder.device)
                        if repeat >= WARM_STEPS and block_step > 0:
                            times[depth].append(time.perf_counter() - start)
            for depth, timed in times.items():
                seconds[(batch, depth + 1)] = statistics.median(timed)
    return PassCost(seconds)


def choose_depth(cost: PassCost, rows: int, max_depth: int, reached: Sequence[float],
                 accepted: Sequence[float]) -> int:
    """The depth in ``0 .. max_depth`` with the most expected tokens per second for ``rows`` rows (module
    docstring); ``reached[j]`` / ``accepted[j]``: (row, step) pairs whose tree reached / accepted depth
    ``j + 1`` (:class:`DepthEvidence`' faded counts, or any others)."""
    if rows < 1 or max_depth < 1:
        return 0
    best, best_rate = 0, rows / cost(rows, 1) * (1.0 + DRAFT_MARGIN)
    expected, survive = 1.0, 1.0
    for depth in range(1, max_depth + 1):
        seen = reached[depth - 1] if depth - 1 < len(reached) else 0
        hits = accepted[depth - 1] if depth - 1 < len(accepted) else 0
        survive *= (hits + PRIOR_WEIGHT * PRIOR_ACCEPTANCE) / (seen + PRIOR_WEIGHT)
        expected += survive
        rate = rows * expected / cost(rows, depth + 1)
        if rate > best_rate:
            best, best_rate = depth, rate
    return best
