"""Rewrite citations of documents that are not in the repository into citations of docs/.

Run from the repository root (or give ``--root``):

    python scripts/rewrite_citations.py            # rewrite in place, print a summary
    python scripts/rewrite_citations.py --check    # only report what would change; exit 1 if anything would

Every ``*.py`` and ``*.md`` file outside ``docs/`` (and outside hidden and build directories) is rewritten:

* the external algorithm specification -> ``docs/algorithms.md`` and the external test plan ->
  ``docs/testing.md``, same section numbers. A bare number or a section sign after the name becomes
  ``section N``; the test plan's ``0.N`` (item N of its section 0) becomes ``section 0 (item N)``; its
  ``layer A1``..``E`` and ``C2``-style item names gain the subsection they live in (4.1 .. 4.5);
* seed-file paths (``seeds/00N`` with or without the hash suffix and ``.txt``) -> ``seed 00N``; the first
  one in each file also points to ``docs/papers.md``, which describes the four seeds;
* the external style guide's and peer survey's item codes -> the docs section that now covers the topic
  (see ``_LESSONS``); an item code without a mapping is left alone and reported.

The summary lists the number of rewrites per file and kind, and every citation it could not map.
``tests/test_docs.py`` fails until no such citation is left. This file itself is skipped (it has to name
the old documents).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator

_SELF = os.path.abspath(__file__)
_SKIP_DIRS = {"docs", "__pycache__", "node_modules", "build", "dist"}

_NUMBER = r"\d+(?:\.\d+)*"

# the external specification / test plan, then an optional section reference
_SPEC = re.compile(
    r"(?P<name>ALGORITHMS|TESTING)\.md(?P<tick>`?)"
    r"(?:(?P<sep>,?[ \t]+)"
    r"(?:(?P<word>§[ \t]*|sections?[ \t]+|sec\.[ \t]*)?(?P<num>" + _NUMBER + r")"
    r"|(?P<layer>layers?[ \t]+(?P<letter>[A-E])[0-9]*(?:[-–][A-E]?[0-9]+)?)"
    r"|(?P<item>(?P<iletter>[A-D])[0-9]+)\b"
    r"|(?P<appendix>[Aa]ppendix[ \t]+A)))?"
)
_LAYER_SECTION = {"A": "4.1", "B": "4.2", "C": "4.3", "D": "4.4", "E": "4.5"}

_SEED = re.compile(r"(?P<open>`?)seeds/(?P<num>\d{3})(?:_[0-9a-f]+)?(?:\.txt)?(?P<close>`?)")

# item codes of the external style guide (P..) and peer survey (A..G) -> where docs/ covers the topic
_LESSONS: dict[tuple[str, str], str] = {
    ("STYLE", "P3"): "docs/engine.md section 4",  # replayable randomness budget
    ("STYLE", "P4"): "docs/algorithms.md section 9",  # shared sampling primitives and comparison rule
    ("PEERS", "C3"): "docs/engine.md section 2",  # depth-based positions in tree attention
    ("PEERS", "D2"): "docs/engine.md section 3",  # accepted KV compacted right after verification
    ("PEERS", "D4"): "docs/engine.md section 3",  # gather instead of crop and re-forward
    ("PEERS", "G3"): "docs/engine.md section 6",  # formal metric definitions
}
_LESSON = re.compile(
    r"(?P<open>`?)(?P<doc>STYLE|PEERS)\.md(?P<close>`?)"
    r"(?:,?[ \t]+(?P<codes>[A-Z]\d+(?:(?:,[ \t]*|[ \t]+and[ \t]+)[A-Z]\d+)*))?"
)


class Rewriter:
    """Rewrites one file's text; counts what it did and collects what it could not map."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.unmapped: list[str] = []
        self._seeds_seen = False

    def _spec(self, m: re.Match[str]) -> str:
        doc = "docs/algorithms.md" if m["name"] == "ALGORITHMS" else "docs/testing.md"
        self.counts[doc] += 1
        head = doc + m["tick"]
        if m["sep"] is None:
            return head
        sep = m["sep"]
        if m["num"] is not None:
            word = m["word"] or ""
            num = m["num"]
            if m["name"] == "TESTING" and re.fullmatch(r"0\.\d+", num):
                plural = "sections" if word.startswith("sections") else "section"
                return f"{head}{sep}{plural} 0 (item {num.split('.')[1]})"
            if word.startswith("section"):
                return f"{head}{sep}{word}{num}"
            return f"{head}{sep}section {num}"
        if m["layer"] is not None:
            if re.match(r",?[ \t]+sections?[ \t]+\d", m.string[m.end():]):  # the section is already named
                return f"{head}{sep}{m['layer']}"
            return f"{head}{sep}section {_LAYER_SECTION[m['letter']]}, {m['layer']}"
        if m["item"] is not None:
            return f"{head}{sep}section {_LAYER_SECTION[m['iletter']]} ({m['item']})"
        return f"{head}{sep}Appendix A"

    def _seed(self, m: re.Match[str]) -> str:
        self.counts["seed"] += 1
        opened, closed = m["open"], m["close"]
        if opened and closed:  # a backticked path becomes plain "seed 00N" (the backticks only marked a path)
            opened = closed = ""
        text = f"seed {m['num']}"
        if not self._seeds_seen:
            self._seeds_seen = True
            text += " (docs/papers.md)"
        return f"{opened}{text}{closed}"

    def _lesson(self, m: re.Match[str]) -> str:
        codes = re.findall(r"[A-Z]\d+", m["codes"] or "")
        targets = [_LESSONS.get((m["doc"], c)) for c in codes]
        if not codes or any(t is None for t in targets):
            self.unmapped.append(m.group(0))
            return m.group(0)
        self.counts["lesson"] += 1
        unique = list(dict.fromkeys(t for t in targets if t is not None))
        return m["open"] + "; ".join(unique) + m["close"]

    def rewrite(self, text: str) -> str:
        text = _SPEC.sub(self._spec, text)
        text = _SEED.sub(self._seed, text)
        return _LESSON.sub(self._lesson, text)


def source_files(root: str) -> Iterator[str]:
    """Every ``*.py`` and ``*.md`` file under ``root`` outside docs/, hidden and build directories."""
    for directory, subdirs, files in os.walk(root):
        rel = os.path.relpath(directory, root)
        subdirs[:] = sorted(
            d for d in subdirs
            if not d.startswith(".") and not d.endswith(".egg-info") and not (rel == "." and d in _SKIP_DIRS)
            and d not in ("__pycache__", "node_modules")
        )
        for name in sorted(files):
            path = os.path.join(directory, name)
            if name.endswith((".py", ".md")) and os.path.abspath(path) != _SELF:
                yield path


def run(root: str, write: bool, out: Callable[[str], None] = print) -> tuple[Counter[str], list[tuple[str, str]]]:
    """Rewrite (or, with ``write=False``, only count) every file; returns totals and unmapped citations."""
    totals: Counter[str] = Counter()
    unmapped: list[tuple[str, str]] = []
    for path in source_files(root):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        rewriter = Rewriter()
        new = rewriter.rewrite(text)
        rel = os.path.relpath(path, root)
        unmapped.extend((rel, u) for u in rewriter.unmapped)
        if new != text:
            totals.update(rewriter.counts)
            totals["files"] += 1
            out(f"{rel}: " + ", ".join(f"{k} {v}" for k, v in sorted(rewriter.counts.items())))
            if write:
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(new)
    return totals, unmapped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(_SELF)), help="repository root")
    parser.add_argument("--check", action="store_true", help="report only; exit 1 if anything would change")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.root, "docs")):
        print(f"error: {args.root!r} has no docs/ directory", file=sys.stderr)
        return 2
    totals, unmapped = run(args.root, write=not args.check)
    summary = ", ".join(f"{k} {v}" for k, v in sorted(totals.items())) or "nothing to rewrite"
    print(("would rewrite: " if args.check else "rewrote: ") + summary)
    for rel, citation in unmapped:
        print(f"unmapped: {rel}: {citation!r}", file=sys.stderr)
    if args.check and (totals or unmapped):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
