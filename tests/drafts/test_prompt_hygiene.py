"""No benchmark prompt is a near-paraphrase of a prompt whose answer is in the retrieval datastore
(the datastore once held "Write a short poem about snow." while the chat benchmark asks "Write a short
poem about winter snow."; the old guard, tests/drafts/test_peer_prompts.py, compared substrings only).

The similarity is n-gram overlap of the prompts' content words (:func:`spec_fast.drafts.prompts.near_duplicate`),
checked for every benchmark prompt (bench/engine.py, bench/target_cost.py, bench/threads.py, bench/peers.py's
workloads, the held-out set every draft benchmark uses, bench/study.py's prompts) against every prompt the
datastore and the drafts' training data were built from. The prompts it finds are left out of the datastore
(``DATASTORE_EXCLUDED``); the committed trained drafts saw them in training (the same nine prompts), which
only retraining can change: the last test pins that list so that a new overlap fails.
"""

from __future__ import annotations

import json
import os

from bench import engine as bench_engine
from bench import target_cost as bench_target_cost
from bench import threads as bench_threads
from bench.peers import WORKLOADS
from spec_fast.drafts.prompts import (DATASTORE_EXCLUDED, HELDOUT_PROMPTS, TRAIN_PROMPTS, near_duplicate,
                                      synthetic_prompts)
from spec_fast.drafts.retrieval import load_datastore
from spec_fast.drafts.training import TrainConfig
from tests.drafts.test_peer_prompts import _pool

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def benchmark_prompts() -> set[str]:
    prompts = set(bench_engine.PROMPTS) | set(bench_target_cost.PROMPTS) | set(bench_threads.PROMPTS)
    prompts |= set(HELDOUT_PROMPTS) | {p for workload in WORKLOADS.values() for p in workload}
    with open(os.path.join(ROOT, "bench", "data", "study_prompts.json"), encoding="utf-8") as handle:
        study = json.load(handle)
    prompts |= {p for kind in study["kinds"].values() for p in kind if isinstance(p, str)}
    assert len(prompts) > 70
    return prompts


def datastore_prompts() -> list[str]:
    """The prompts of the datastore's sequences, in order (scripts/train_drafts.py)."""
    every = list(TRAIN_PROMPTS) + synthetic_prompts(TrainConfig.synthetic_prompts, TrainConfig.seed)
    return [p for p in every if p not in DATASTORE_EXCLUDED]


def near_duplicates(benchmark: set[str], used: list[str]) -> set[tuple[str, str]]:
    return {(b, u) for b in benchmark for u in used if near_duplicate(b, u)}


def test_the_similarity_flags_paraphrases_and_not_a_shared_template() -> None:
    assert near_duplicate("Write a short poem about winter snow.", "Write a short poem about snow.")
    assert near_duplicate("Why is the sky blue? Answer briefly.", "Why is the sky blue?")
    assert near_duplicate("What is photosynthesis?", "what is PHOTOSYNTHESIS")
    # negative controls: the same template about another subject, and an unrelated prompt
    assert not near_duplicate("Write a short poem about the sea.", "Write a short poem about mathematics.")
    assert not near_duplicate("Tell me a fun fact about elephants.", "Tell me a fun fact about octopuses.")
    assert not near_duplicate("Summarise this long text about the railway station library.", "What is trains?")


def test_no_benchmark_prompt_is_a_near_paraphrase_of_a_datastore_prompt() -> None:
    assert near_duplicates(benchmark_prompts(), datastore_prompts()) == set()


def test_the_check_catches_a_planted_paraphrase() -> None:
    """Negative control of the previous test: the datastore as it was (with the issue's prompt) fails."""
    planted = datastore_prompts() + ["Write a short poem about snow."]
    assert near_duplicates(benchmark_prompts(), planted) == {
        ("Write a short poem about winter snow.", "Write a short poem about snow.")}


def test_the_datastore_holds_the_kept_prompts_answers_and_names_the_excluded() -> None:
    sequences, meta = load_datastore()
    assert len(sequences) == len(datastore_prompts()) == 1520 - len(DATASTORE_EXCLUDED)
    assert json.loads(meta["excluded"]) == list(DATASTORE_EXCLUDED)
    assert meta["prompts"].startswith("TRAIN_PROMPTS + synthetic_prompts")


def test_the_excluded_prompts_are_exactly_those_the_check_finds_and_what_the_drafts_saw() -> None:
    """Over the whole training pool (the drafts' prompts and the selector data set's), the near-paraphrases
    of benchmark prompts are exactly DATASTORE_EXCLUDED: no exclusion is stale, and these nine are the
    overlap that the committed trained drafts still carry (retraining without them changes that)."""
    found = {u for _, u in near_duplicates(benchmark_prompts(), _pool())}
    assert found == set(DATASTORE_EXCLUDED)
