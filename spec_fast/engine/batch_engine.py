"""BatchEngine: continuous batching over a decoder (:class:`~spec_fast.engine.SpeculativeDecoder`).

Requests join and leave a running batch. :meth:`BatchEngine.add_request` queues a request;
:meth:`BatchEngine.step` first admits waiting requests up to ``max_batch_size`` (each admission prefills its
prompts and appends their rows to the running batch; no running row is recomputed), then runs one decoding
step for every running request and returns what each produced. A request that finishes (EOS, a stop string,
its token budget) or is aborted leaves the batch at once and frees its cache rows for the next.

Every request has its own sampling parameters, seed, token budget and stop strings. Its random draws come
from streams keyed by its own seed and advanced by its own steps (:mod:`spec_fast.draws`), and each row
of a pass is computed on its own, so under a fixed strategy a request's output does not depend on what
else shares the batch: greedy output is the same as the request run alone, and so is seeded sampled
output (docs/engine.md section 10).

Single-threaded by design: one thread (e.g. a server's engine thread) calls every method; the engine takes
no locks. Several engines may share one decoder, each from its own thread.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from spec_fast.engine.decode_state import DecodeState
from spec_fast.engine.prefix_cache import DEFAULT_PREFIX_CACHE_TOKENS, PrefixCache, reuse_is_exact
from spec_fast.decoding import SamplingParams
from spec_fast.detokenize import IncrementalText, final_length
from spec_fast.drafts.dual import DualDrafter
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.proposer import Proposer
from spec_fast.strategies import Strategy

if TYPE_CHECKING:
    from spec_fast.engine.batch_depth import PassCost

__all__ = ["BatchEngine", "StepDecoder", "RequestOutput", "RequestStats", "QueueFullError", "FINISH_REASONS",
           "DEPTH_POLICIES"]

#: ``cost``: each step's draft depth from the batch's size and the measured cost of a step
#: (:mod:`spec_fast.engine.batch_depth`); ``fixed``: the strategy's depth (a seeded request's output is then the
#: same whatever shares its batch)
DEPTH_POLICIES = ("cost", "fixed")
#: why a request ended: EOS or a stop string, its ``max_new_tokens``, or :meth:`BatchEngine.abort`
FINISH_REASONS = ("stop", "length", "abort")


@runtime_checkable
class StepDecoder(Protocol):
    """What :class:`BatchEngine` drives: a decoder that holds the models and the strategy and advances a
    :class:`DecodeState` one step at a time (:class:`spec_fast.engine.SpeculativeDecoder` is the one this
    package ships). Written as a protocol so that the scheduler sits below the decoder whose ``generate``
    runs on it, with no import between them in the other direction."""

    strategy: Strategy
    drafter: Drafter | None
    proposer: Proposer

    def check_request(self, prompt: Sequence[int], max_new_tokens: int, sampling: SamplingParams | None = None,
                      name: str = "prompt") -> None: ...

    def begin(self, prompts: list[list[int]], max_new: list[int], samplings: list[SamplingParams],
              streams: list[int], eos: set[int], record_trees: bool = False,
              prefix_cache: PrefixCache | None = None) -> DecodeState: ...

    def step(self, st: DecodeState) -> list[list[int]]: ...

    def step_cost(self, max_rows: int = 8) -> PassCost: ...


class QueueFullError(RuntimeError):
    """:meth:`BatchEngine.add_request` while ``max_waiting`` requests already wait for a slot."""


@dataclass
class RequestStats:
    """One request's counters: ``target_passes`` = steps it took part in; ``draft_tokens`` = drafted nodes the
    target verified for it; ``accepted_tokens`` = draft tokens it accepted; ``accepted_length_histogram[t]``
    = its steps that accepted exactly ``t`` draft tokens; ``accepted_per_position[d]`` = its steps that
    accepted a draft token at depth ``d + 1``; ``queue_s`` = seconds from ``add_request`` to admission,
    ``ttft_s`` to its first token, ``wall_s`` to its end (or the last step)."""

    prompt_tokens: int = 0
    #: prompt tokens whose cache entries were reused from an earlier prompt (not prefilled)
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    target_passes: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_length_histogram: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    queue_s: float = 0.0
    ttft_s: float = 0.0
    wall_s: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Draft tokens accepted per step (the extra token excluded)."""
        return self.accepted_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tpot_s(self) -> float:
        """Seconds per output token after the first."""
        return (self.wall_s - self.ttft_s) / (self.generated_tokens - 1) if self.generated_tokens > 1 else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(mean_accepted_length=self.mean_accepted_length, tpot_s=self.tpot_s)
        return out

    def record(self, accepted: int, drafted: int) -> None:
        """One step of this request: ``accepted`` draft tokens accepted out of ``drafted`` drafted nodes."""
        self.target_passes += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        while len(self.accepted_length_histogram) <= accepted:
            self.accepted_length_histogram.append(0)
        self.accepted_length_histogram[accepted] += 1
        while len(self.accepted_per_position) < accepted:
            self.accepted_per_position.append(0)
        for d in range(accepted):
            self.accepted_per_position[d] += 1


@dataclass(frozen=True)
class RequestOutput:
    """What one request produced in one :meth:`BatchEngine.step`.

    ``new_tokens``: ids generated this step (EOS included when hit; none after a stop string's completing
    token); ``finish_reason``: one of :data:`FINISH_REASONS` once ``finished``, else None; ``text`` (with a
    tokenizer): the whole output text so far (special tokens skipped), cut just before a stop string when
    one ended it; while running it holds back an unfinished UTF-8 character and a trailing prefix of a
    stop string, so each ``text`` extends the previous one; ``stats``: the request's :class:`RequestStats`.
    """

    request_id: int
    new_tokens: list[int]
    finished: bool
    finish_reason: str | None
    text: str | None
    stats: RequestStats


@dataclass
class _Request:
    request_id: int
    prompt: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    stop: tuple[str, ...]
    stream: int
    arrival: float
    stats: RequestStats
    tokens: list[int] = field(default_factory=list)
    admitted: float = 0.0
    detok: IncrementalText | None = None  # the text of `tokens`, kept up to date by _request_text
    text_checked: int = 0  # tokens whose text the last stop-string search covered


class BatchEngine:
    """Continuous batching of requests over ``decoder`` (module docstring).

    ``max_batch_size``: the most requests decoded together; ``max_waiting``: the most requests waiting
    for a slot (None: unbounded; :class:`QueueFullError` beyond); ``tokenizer`` (optional): needed for stop
    strings and ``RequestOutput.text``; ``eos_token_id``: the end-of-sequence id(s) (default: the
    tokenizer's, if any); ``depth_policy`` (:data:`DEPTH_POLICIES`): ``cost`` (the default) lets each
    step's draft depth follow the batch (deep trees when alone, shallower or none when the batch fills the
    pass: the output law is unchanged and a seeded run reproducible for the same arrival schedule),
    ``fixed`` keeps the strategy's depth, so that a seeded request decodes exactly as alone.
    ``static=True`` is what ``SpeculativeDecoder.generate`` uses (with ``fixed``): finished rows stay in
    the batch until the last ends (their state remains readable), and requests are admitted only into an
    empty batch.

    ``prefix_cache_tokens``: the budget (prompt tokens) of the :class:`~spec_fast.engine.prefix_cache.PrefixCache`
    through which admissions reuse the cache entries of prompt prefixes seen before; None (the default) gives
    :data:`~spec_fast.engine.prefix_cache.DEFAULT_PREFIX_CACHE_TOKENS` where reuse is exact for the target
    (:func:`~spec_fast.engine.prefix_cache.reuse_is_exact`) and the batch is not static, else none; 0 turns
    it off. Reuse changes no token of any request, only the prefill's work.
    Strategies that decide for the whole batch admit only requests compatible with it, the others waiting
    in order: a dual draft does not mix greedy and sampled requests, and ``nde`` (whose selector picks one
    shape per step for the batch) decodes static batches of one sampling law. Not thread-safe: call every
    method from one thread.
    """

    def __init__(self, decoder: StepDecoder, max_batch_size: int = 4, max_waiting: int | None = None,
                 tokenizer: Any | None = None, eos_token_id: int | Sequence[int] | None = None,
                 *, depth_policy: str = "cost", static: bool = False, record_trees: bool = False,
                 prefix_cache_tokens: int | None = None) -> None:
        if not isinstance(decoder, StepDecoder):
            raise ValueError(f"decoder must be a SpeculativeDecoder, got {type(decoder).__name__}")
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1, got max_batch_size={max_batch_size!r}")
        if max_waiting is not None and (isinstance(max_waiting, bool) or not isinstance(max_waiting, int)
                                        or max_waiting < 0):
            raise ValueError(f"max_waiting must be None or an integer >= 0, got max_waiting={max_waiting!r}")
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = getattr(tokenizer, "eos_token_id", None)
        if isinstance(eos_token_id, bool) or not (eos_token_id is None or isinstance(eos_token_id, int) or all(
                isinstance(t, int) and not isinstance(t, bool) for t in eos_token_id)):
            raise ValueError(f"eos_token_id must be None, an int or a sequence of ints, got eos_token_id={eos_token_id!r}")
        if depth_policy not in DEPTH_POLICIES:
            raise ValueError(f"depth_policy must be one of {DEPTH_POLICIES}, got depth_policy={depth_policy!r}")
        if prefix_cache_tokens is not None and (isinstance(prefix_cache_tokens, bool) or not isinstance(
                prefix_cache_tokens, int) or prefix_cache_tokens < 0):
            raise ValueError(f"prefix_cache_tokens must be None or an integer >= 0, got "
                             f"prefix_cache_tokens={prefix_cache_tokens!r}")
        exact = reuse_is_exact(getattr(decoder, "target", None), getattr(decoder, "device", torch.device("cpu")))
        if prefix_cache_tokens and not exact:
            raise ValueError(f"prefix_cache_tokens={prefix_cache_tokens} needs a target whose reused cache entries "
                             "equal recomputed ones (the lean model on the CPU); pass 0 or None")
        if prefix_cache_tokens is None:
            prefix_cache_tokens = DEFAULT_PREFIX_CACHE_TOKENS if exact and not static else 0
        if not static and max_batch_size > 1:
            _check_row_operations(decoder.drafter)
        self.decoder = decoder
        self.max_batch_size = max_batch_size
        self.max_waiting = max_waiting
        self.tokenizer = tokenizer
        self.eos: set[int] = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
        self.static = static
        self.depth_policy = depth_policy
        self.record_trees = record_trees
        #: the prompt prefixes admissions reuse (None: off)
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        #: the running batch (None when empty): row b is request ``self._rows[b]``
        self.state: DecodeState | None = None
        self._rows: list[_Request] = []
        self._waiting: deque[_Request] = deque()
        self._ids = itertools.count()
        self._queued_outputs: list[RequestOutput] = []

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt_ids: Sequence[int], sampling: SamplingParams, max_new_tokens: int,
                    stop: Sequence[str] = (), *, stream: int = 0) -> int:
        """Queue a request; returns its id. ``stream`` picks which of the seed's streams it draws from
        (requests with the same seed and stream draw the same numbers). ``ValueError`` (one line, naming the
        argument) for bad input; :class:`QueueFullError` when ``max_waiting`` requests already wait."""
        try:
            prompt = [int(t) for t in prompt_ids]
        except (TypeError, ValueError):
            raise ValueError(f"prompt_ids must be a sequence of token ids, got {type(prompt_ids).__name__}") from None
        if isinstance(prompt_ids, (str, bytes)):
            raise ValueError("prompt_ids must be a sequence of token ids, got a string (tokenize it first)")
        self.decoder.check_request(prompt, max_new_tokens, sampling, name="prompt_ids")
        stops = (stop,) if isinstance(stop, str) else tuple(stop)
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop must be a sequence of non-empty strings, got stop={stop!r}")
        if stops and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: pass tokenizer= to BatchEngine")
        if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
            raise ValueError(f"stream must be an integer >= 0, got stream={stream!r}")
        if self.max_waiting is not None and len(self._waiting) >= self.max_waiting:
            raise QueueFullError(f"{len(self._waiting)} requests already wait (max_waiting={self.max_waiting})")
        request = _Request(next(self._ids), prompt, sampling, max_new_tokens, stops, stream, time.perf_counter(),
                           RequestStats(prompt_tokens=len(prompt)))
        self._waiting.append(request)
        return request.request_id

    def abort(self, request_id: int) -> bool:
        """End a waiting or running request now (its cache rows are freed at once); its next
        :class:`RequestOutput` has ``finish_reason="abort"``. False when it is unknown or already ended."""
        for request in self._waiting:
            if request.request_id == request_id:
                self._waiting.remove(request)
                self._queued_outputs.append(self._output(request, [], "abort"))
                return True
        for b, request in enumerate(self._rows):
            if request.request_id == request_id and self.state is not None and self.state.active[b]:
                self.state.active[b] = False
                self._queued_outputs.append(self._output(request, [], "abort"))
                if not self.static:
                    self._keep_rows([i for i in range(len(self._rows)) if i != b])
                return True
        return False

    def has_unfinished(self) -> bool:
        """True while a request waits or runs, or an output (an abort's) is still to be returned by step."""
        return bool(self._waiting) or self.num_running > 0 or bool(self._queued_outputs)

    @property
    def num_running(self) -> int:
        return sum(self.state.active) if self.state is not None else 0

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # ------------------------------------------------------------------ the loop
    @torch.no_grad()
    def step(self) -> list[RequestOutput]:
        """Admit waiting requests (prefill), then one decoding step of every running request; returns one
        output per request that produced tokens or ended (aborts since the last call included)."""
        outputs, self._queued_outputs = self._queued_outputs, []
        self._admit()
        state = self.state
        if state is None or not any(state.active):
            return outputs
        was_active = list(state.active)
        new_tokens = self.decoder.step(state)
        now = time.perf_counter()
        finished_rows = []
        for b, request in enumerate(self._rows):
            if not was_active[b]:
                continue
            request.stats.record(max(state.step_accepted[b], 0), max(state.step_drafted[b], 0))
            tokens = new_tokens[b]
            if tokens and not request.tokens:
                request.stats.ttft_s = now - request.arrival
            request.tokens.extend(tokens)
            request.stats.generated_tokens = len(request.tokens)
            request.stats.wall_s = now - request.arrival
            reason = None if state.active[b] else ("stop" if request.tokens and request.tokens[-1] in self.eos
                                                   else "length")
            text, stop_at = self._text(request, finished=reason is not None)
            if stop_at is not None:  # a stop string ended it: drop the tokens after the one completing it
                tokens = tokens[: max(0, len(tokens) - (len(request.tokens) - stop_at))]
                request.tokens = request.tokens[:stop_at]
                request.stats.generated_tokens = len(request.tokens)
                state.active[b] = False
                reason = "stop"
            if reason is not None:
                finished_rows.append(b)
            if tokens or reason is not None:
                outputs.append(RequestOutput(request.request_id, list(tokens), reason is not None, reason, text,
                                             _snapshot(request.stats)))
        if finished_rows and not self.static:
            self._keep_rows([b for b in range(len(self._rows)) if b not in finished_rows])
        return outputs

    def _admit(self) -> None:
        """Prefill the waiting requests that fit (in arrival order, stopping at one that cannot join yet)
        and append their rows to the running batch."""
        if self.static and self.state is not None and any(self.state.active):
            return
        if self.static:
            self._keep_rows([])
        admitted: list[_Request] = []
        while self._waiting and len(self._rows) + len(admitted) < self.max_batch_size:
            request = self._waiting[0]
            if not self._compatible(request, admitted):
                break
            admitted.append(self._waiting.popleft())
        if not admitted:
            return
        now = time.perf_counter()
        for request in admitted:
            request.admitted = now
            request.stats.queue_s = now - request.arrival
        joining = self.decoder.begin([r.prompt for r in admitted], [r.max_new_tokens for r in admitted],
                                     [r.sampling for r in admitted], [r.stream for r in admitted], self.eos,
                                     self.record_trees, self.prefix_cache)
        for request, cached in zip(admitted, joining.cached_prompt):
            request.stats.cached_prompt_tokens = cached
        if self.depth_policy == "cost" and self.decoder.strategy.drafts:
            joining.step_cost = self.decoder.step_cost(self.max_batch_size)
        if self.state is None:
            self.state = joining
            if not self.static:  # room for a full batch: later requests join by a copy of their own rows
                joining.target_cache.reserve_rows(self.max_batch_size)
        else:
            self.state.join(joining)
        self._rows.extend(admitted)

    def _compatible(self, request: _Request, admitted: list[_Request]) -> bool:
        """Whether ``request`` may join the running rows and those admitted with it."""
        return self.decoder.proposer.compatible(request.sampling, [r.sampling for r in self._rows],
                                                [r.sampling for r in admitted])

    def _keep_rows(self, rows: list[int]) -> None:
        """Keep only running rows ``rows`` (the others' cache rows are freed). A kept row stays where it is
        unless it sits behind the kept count; those fill the holes, so a departure moves at most as many
        rows' cache entries as left, not every row behind it (no request's output depends on its row)."""
        if len(rows) == len(self._rows):
            return
        rows = hole_filling_order(rows)
        self._rows = [self._rows[b] for b in rows]
        if not rows:
            self.state = None
        elif self.state is not None:
            self.state.take_rows(rows)

    # ------------------------------------------------------------------ text
    def _text(self, request: _Request, finished: bool) -> tuple[str | None, int | None]:
        """``(text, stop_at)``: the output text so far (module rule) and, when a stop string occurs in it,
        the number of tokens up to the one whose text completed it."""
        if self.tokenizer is None:
            return None, None
        text = self._request_text(request)
        assert request.detok is not None  # kept in step with request.tokens by _request_text
        # the search for the completing token starts at this step's tokens: the text before them held no stop
        # string (its search would have stopped the request)
        cut, stop_at = request.detok.first_stop(text, request.stop, request.text_checked)
        request.text_checked = len(request.tokens)
        if cut >= 0:
            return text[:cut], stop_at if stop_at is not None else len(request.tokens)
        if not finished:
            text = text[: final_length(text, request.stop)]
        return text, None

    def _request_text(self, request: _Request) -> str:
        """The text of ``request.tokens``, decoding only the tokens past a settled prefix
        (:class:`spec_fast.detokenize.IncrementalText`): a whole decode per step grew with the reply."""
        detok = request.detok
        if detok is None:
            detok = request.detok = IncrementalText(self.tokenizer)
        if len(detok.tokens) > len(request.tokens):  # a stop string cut the reply
            detok.truncate(len(request.tokens))
        detok.extend(request.tokens[len(detok.tokens):])
        return detok.text()

    def _output(self, request: _Request, tokens: list[int], reason: str) -> RequestOutput:
        request.stats.wall_s = time.perf_counter() - request.arrival
        text = None
        if self.tokenizer is not None:
            text = self._request_text(request)
        return RequestOutput(request.request_id, tokens, True, reason, text, _snapshot(request.stats))


def hole_filling_order(rows: list[int]) -> list[int]:
    """``rows`` (distinct row indices) reordered so that each row below ``len(rows)`` keeps its place and the
    others fill the places left free, in order: ``[0, 2, 4] -> [0, 4, 2]``."""
    count = len(rows)
    staying = {b for b in rows if b < count}
    movers = iter(b for b in rows if b >= count)
    return [i if i in staying else next(movers) for i in range(count)]


def _snapshot(stats: RequestStats) -> RequestStats:
    """A copy that later steps do not change (its lists copied; the other fields are numbers). Taken for every
    output of every step: ``asdict``'s recursive deep copy cost more than the copy it made."""
    copied = copy.copy(stats)
    for item in fields(stats):
        value = getattr(stats, item.name)
        if isinstance(value, list):
            setattr(copied, item.name, list(value))
    return copied


def _check_row_operations(drafter: Drafter | None) -> None:
    """A ``ValueError`` for a drafter whose state cannot drop or append rows (a running batch needs both)."""
    heads = drafter.heads if isinstance(drafter, DualDrafter) else (drafter,) if drafter is not None else ()
    for head in heads:
        kind = type(head)
        if kind.take_rows is Drafter.take_rows or kind.join_rows is Drafter.join_rows:
            raise ValueError(f"drafter {kind.__name__} cannot change the rows of a running batch (it defines no "
                             "take_rows/join_rows); use max_batch_size=1 or SpeculativeDecoder.generate")
