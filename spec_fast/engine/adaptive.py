"""``+adaptive``: choose speculative or plain decoding steps by measured throughput.

Both kinds of step are exact, so the controller changes speed only, never the output law. At T = 0 it
never changes the tokens either (greedy speculative output equals greedy AR), so a decoder may keep one
controller across ``generate`` calls. At T > 0 the two kinds of step turn the same seed into different
samples, and a choice made from wall time would make a seeded call irreproducible: the engine consults the
controller at T = 0 only and speculates on every step at T > 0.

A step may come with a *hint*, a class of the context the next draft starts from (the engine passes the
retrieval draft's match length there, :func:`match_hint`): a function of the tokens
so far, never of random draws. The controller then learns the tokens a speculative step yields per hint
class, so it drafts where the draft tends to be accepted (a long match) and takes plain steps where it
tends not to be (no match: a width-1 pass is plain decoding, without the draft's cost). Being a function
of the text, the hint keeps greedy choices deterministic and leaves the argument above unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine imports this module
    from spec_fast.drafts.batch import HeadTrack

__all__ = ["AdaptiveController", "HINT_CLASSES", "match_hint"]

#: hints are clipped to ``0 .. HINT_CLASSES - 1`` (match lengths of 3 and more forecast alike)
HINT_CLASSES = 4


class AdaptiveController:
    """Exponential moving averages of seconds per step for both kinds of step (the wall time of the whole
    step, drafting and the drafter's catch-up on tokens of plain steps included), of tokens per plain step,
    and of tokens per speculative step in each hint class.

    In a hint class, a speculative step's rate is the class's tokens per speculative step over the seconds
    per speculative step (the pass costs the same whatever the hint), a plain step's rate is shared by all
    classes. A class starts with one speculative step (and the controller with one plain step after its
    first speculative one), then runs whichever kind has the higher tokens/s, probing the other kind after
    ``probe_every`` steps of that class; every probe that confirms the choice multiplies the class's
    interval by 2, or by 4 when the loser reached less than ``clear_margin`` of the winner's rate, up to
    ``max_interval`` (so a losing kind costs O(log n) probes but a change of regime is still noticed); a
    probe that flips the choice resets the interval to ``probe_every``. Without hints (always 0) this is
    one class: a rate comparison of the two kinds. Calls are serialised by a lock, so concurrent
    ``generate`` calls of one decoder may share it (at T = 0 its decisions never change tokens).
    """

    def __init__(self, probe_every: int = 8, decay: float = 0.7, max_interval: int = 1024,
                 clear_margin: float = 0.75) -> None:
        self.clear_margin = clear_margin
        self.initial_interval = probe_every
        self.max_interval = max_interval
        self.decay = decay
        #: tokens per plain step / per speculative step of each hint class (absent until measured)
        self.plain_tokens: float | None = None
        self.spec_tokens: dict[int, float] = {}
        #: seconds per step of each kind (True = speculative)
        self.seconds: dict[bool, float] = {}
        self.steps = 0
        self.probe_every = [probe_every] * HINT_CLASSES
        self.since_probe = [0] * HINT_CLASSES
        #: the class whose probe awaits its observation, and the kind that class ran before it
        self.probing: int | None = None
        self.best = [True] * HINT_CLASSES
        self._lock = threading.Lock()

    @staticmethod
    def hint_class(hint: int) -> int:
        return min(max(int(hint), 0), HINT_CLASSES - 1)

    def rate(self, spec: bool, hint: int = 0) -> float:
        """Measured tokens/s of a step of kind ``spec`` in ``hint``'s class (both must have been observed)."""
        tokens = self.spec_tokens[self.hint_class(hint)] if spec else self.plain_tokens
        assert tokens is not None
        return tokens / max(self.seconds[spec], 1e-9)

    def _known(self, h: int) -> bool:
        return h in self.spec_tokens and self.plain_tokens is not None and True in self.seconds

    def _unmeasured(self, h: int) -> bool | None:
        """The kind class ``h`` takes while a rate it compares is unknown (its first speculative step, then
        the first plain step); None once both are measured."""
        if h not in self.spec_tokens:
            return True
        if self.plain_tokens is None:
            return False
        return None

    def peek(self, hint: int = 0) -> bool:
        """The kind of the next step, without counting it."""
        with self._lock:
            h = self.hint_class(hint)
            first = self._unmeasured(h)
            if first is not None:
                return first
            best = self.rate(True, h) >= self.rate(False)
            return (not best) if self.since_probe[h] >= self.probe_every[h] else best

    def speculate(self, hint: int = 0) -> bool:
        """The kind of the next step (True = speculative) in ``hint``'s class, counted towards its probing
        schedule."""
        with self._lock:
            h = self.hint_class(hint)
            first = self._unmeasured(h)
            if first is not None:
                return first
            self.best[h] = self.rate(True, h) >= self.rate(False)
            if self.since_probe[h] >= self.probe_every[h]:
                self.since_probe[h] = 0
                self.probing = h
                return not self.best[h]
            self.since_probe[h] += 1
            return self.best[h]

    def observe(self, spec: bool, tokens: float, seconds: float, hint: int = 0) -> None:
        """One finished step of kind ``spec`` in ``hint``'s class that emitted ``tokens`` per row in ``seconds``."""
        with self._lock:
            h = self.hint_class(hint)
            d = self.decay
            self.steps += 1
            self.seconds[spec] = seconds if spec not in self.seconds else d * self.seconds[spec] + (1 - d) * seconds
            if spec:
                old = self.spec_tokens.get(h)
                self.spec_tokens[h] = tokens if old is None else d * old + (1 - d) * tokens
            else:
                self.plain_tokens = tokens if self.plain_tokens is None else d * self.plain_tokens + (1 - d) * tokens
            if self.probing is not None and self._known(self.probing):
                p, self.probing = self.probing, None
                confirmed = (self.rate(True, p) >= self.rate(False)) == self.best[p]
                loser, winner = sorted((self.rate(True, p), self.rate(False)))
                factor = 4 if loser < self.clear_margin * winner else 2
                self.probe_every[p] = (min(factor * self.probe_every[p], self.max_interval) if confirmed
                                       else self.initial_interval)


def match_hint(heads: Sequence[HeadTrack], active: Sequence[bool], dual: bool) -> int:
    """The controller's forecast class of the next draft: the shortest match length over the active rows
    where the single drafter reports one (retrieval), else 0. It is a function of the tokens so far, so
    the controller's greedy choices stay deterministic."""
    if dual or not heads:
        return 0
    head = heads[0]
    match_length = getattr(head.drafter, "match_length", None)
    if match_length is None:
        return 0
    return min((int(match_length(head.state, b, head.pending[b])) for b in range(len(active)) if active[b]),
               default=0)
