"""``+adaptive``: choose speculative or plain decoding steps by measured throughput.

Both kinds of step are exact, so the controller changes speed only, never the output law. At T = 0 it
never changes the tokens either (greedy speculative output equals greedy AR), so a decoder may keep one
controller across ``generate`` calls. At T > 0 the two kinds of step turn the same seed into different
samples, and a choice made from wall time would make a seeded call irreproducible: the engine consults the
controller at T = 0 only and speculates on every step at T > 0.
"""

from __future__ import annotations

import threading

__all__ = ["AdaptiveController"]


class AdaptiveController:
    """Exponential moving averages of tokens per step and seconds per step for both kinds of step (the
    wall time of the whole step, drafting and the drafter's catch-up on tokens of plain steps included).

    Starts with one speculative and one plain step, then runs whichever kind has the higher tokens/s,
    probing the other kind after ``probe_every`` steps; every probe that confirms the choice multiplies the
    interval by 2, or by 4 when the loser reached less than ``clear_margin`` of the winner's rate, up to
    ``max_interval`` (so a losing kind costs O(log n) probes but a change of regime is still noticed); a
    probe that flips the choice resets the interval to ``probe_every``. Calls are serialised by a lock, so
    concurrent ``generate`` calls of one decoder may share it (at T = 0 its decisions never change tokens).
    """

    def __init__(self, probe_every: int = 8, decay: float = 0.7, max_interval: int = 1024,
                 clear_margin: float = 0.75) -> None:
        self.clear_margin = clear_margin
        self.initial_interval = probe_every
        self.probe_every = probe_every
        self.max_interval = max_interval
        self.decay = decay
        self.tokens: dict[bool, float] = {}
        self.seconds: dict[bool, float] = {}
        self.steps = 0
        self.since_probe = 0
        self.probing = False
        self.best = True
        self._lock = threading.Lock()

    def rate(self, spec: bool) -> float:
        return self.tokens[spec] / max(self.seconds[spec], 1e-9)

    def peek(self) -> bool:
        """The kind of the next step, without counting it."""
        with self._lock:
            return self._peek()

    def _peek(self) -> bool:
        if True not in self.tokens:
            return True
        if False not in self.tokens:
            return False
        best = self.rate(True) >= self.rate(False)
        return (not best) if self.since_probe >= self.probe_every else best

    def speculate(self) -> bool:
        """The kind of the next step (True = speculative), counted towards the probing schedule."""
        with self._lock:
            if True not in self.tokens or False not in self.tokens:
                return self._peek()
            self.best = self.rate(True) >= self.rate(False)
            if self.since_probe >= self.probe_every:
                self.since_probe = 0
                self.probing = True
                return not self.best
            self.since_probe += 1
            return self.best

    def observe(self, spec: bool, tokens: float, seconds: float) -> None:
        """One finished step of kind ``spec`` that emitted ``tokens`` per row in ``seconds``."""
        with self._lock:
            self.steps += 1
            if spec not in self.tokens:
                self.tokens[spec], self.seconds[spec] = tokens, seconds
            else:
                d = self.decay
                self.tokens[spec] = d * self.tokens[spec] + (1 - d) * tokens
                self.seconds[spec] = d * self.seconds[spec] + (1 - d) * seconds
            if self.probing and True in self.tokens and False in self.tokens:
                self.probing = False
                confirmed = (self.rate(True) >= self.rate(False)) == self.best
                loser, winner = sorted((self.rate(True), self.rate(False)))
                factor = 4 if loser < self.clear_margin * winner else 2
                self.probe_every = (min(factor * self.probe_every, self.max_interval) if confirmed
                                    else self.initial_interval)
