"""bench/acceptance.py's arithmetic and report without decoding: the ceiling and needed tokens per pass of a row,
the verdict lines, the datastore fractions, a saved run re-rendered, and a user's mistake answered with exit 2."""

from __future__ import annotations

import json
import os

import pytest

from bench import acceptance
from spec_fast.drafts.retrieval import load_datastore

COSTS = {"chat": {1: 4.0, 2: 5.0, 3: 6.0}}
FLOOR = {"bytes_per_token": 96_000_000, "read_bytes_per_s": 24e9, "floor_ms_per_token": 4.0, "floor_tokens_per_s": 250.0}


def _row(draft: str, per_pass: float, relative: float, temperature: float = 0.0) -> dict[str, object]:
    goal = acceptance.GOALS[("chat", temperature)]
    return {"workload": "chat", "temperature": temperature, "draft": draft, "strategy": "chain:2", "prompts": 1,
            "tokens": 10, "passes": 5, "tokens_per_pass": per_pass, "mean_width": 2.0,
            "relative_pass_cost": relative, "ceiling": per_pass / relative, "goal": goal,
            "needed_tokens_per_pass": goal * relative, "greedy_equal_to_plain": True}


def test_verdicts_name_the_best_ceiling_and_the_most_tokens_per_pass() -> None:
    rows = [_row("narrow", 1.32, 1.1), _row("wide", 1.8, 1.6)]  # ceilings 1.20x and 1.125x
    text = "\n".join(acceptance.table(rows, COSTS, FLOOR))
    assert "- chat, T = 0: narrow chain:2 1.20x (1.32 tokens per pass); goal 1.5x: out of reach even with free " \
           "drafting" in text
    assert "- chat, T = 0: wide chain:2 1.80 tokens per pass (goal 1.5x: reached)" in text
    assert "| chat | 0 | wide | chain:2 | 1.800 | 2.00 | 1.600 | 1.12x | 1.5x | 2.40 |" in text
    assert "| chat | 4.00 | 5.00 | 6.00 |" in text
    assert "= 4.00 ms per token (250 tokens/s)" in text


def test_a_ceiling_at_the_goal_is_reachable() -> None:
    lines = "\n".join(acceptance.table([_row("ok", 1.76, 1.1)], COSTS, FLOOR))
    assert "ok chain:2 1.60x (1.76 tokens per pass); goal 1.5x: reachable with free drafting" in lines


def test_datastore_fractions(tmp_path: os.PathLike[str]) -> None:
    sequences, _ = load_datastore()
    half, _ = load_datastore(acceptance.datastore_part(0.5, str(tmp_path)))
    none, _ = load_datastore(acceptance.datastore_part(0.0, str(tmp_path)))
    assert len(half) == round(len(sequences) / 2)
    assert all(s in sequences for s in half[:50])
    assert none == [[0, 1]]


def test_report_from_a_saved_run(tmp_path: os.PathLike[str]) -> None:
    saved = os.path.join(str(tmp_path), "run.json")
    meta = {"commit": "abc", "pass_ms": {"chat": {"1": 4.0, "2": 5.0, "3": 6.0}}, "bandwidth_floor": FLOOR}
    with open(saved, "w") as handle:
        json.dump({"meta": meta, "results": [_row("narrow", 1.3, 1.1)]}, handle)
    out = os.path.join(str(tmp_path), "out")
    assert acceptance.main(["--report-from", saved, "--out", out]) == 0
    with open(os.path.join(out, "acceptance.md")) as handle:
        text = handle.read()
    assert "re-rendered from" in text and "| chat | 0 | narrow | chain:2 | 1.300 |" in text


@pytest.mark.parametrize("args", [["--workloads", "poems"], ["--prompts", "0"], ["--strategies", "chain:x"],
                                  ["--drafts", "retrieval@2"], ["--drafts", "rnn@0.5"], ["--drafts", "medusa"],
                                  ["--report-from", "/nonexistent/run.json"]])
def test_user_mistakes_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert acceptance.main(args) == 2
    assert capsys.readouterr().err.startswith("error:")
