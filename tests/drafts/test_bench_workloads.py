"""bench/workloads.py's held-out prompts share nothing with the prompts that tuned the defaults or fed the
retrieval datastore and the drafts' training: not a prompt (equal or contained, as tests/drafts/test_peer_prompts.py
checks the benchmark's), not a near copy (similar content words), not a copied sentence; and the held-out
split has the size and the variety of documents that its report relies on."""

from __future__ import annotations

from bench.workloads import (DOCUMENTS, HELDOUT, HELDOUT_LONG_DOCUMENT, INPUT_GROUNDED, INPUT_GROUNDED_TASKS, LONG,
                             TUNING, TUNING_CHAT_PROMPTS)
from spec_fast.drafts.prompts import HELDOUT_PROMPTS, prompt_grams
from tests.drafts.test_peer_prompts import _normal, _pool, overlaps

#: Jaccard index of two prompts' content-word 1- and 2-grams (``prompt_grams``: casefolded, function words and
#: a plural s dropped) at or above which they count as the same prompt. Content words rather than word
#: 4-grams: chat prompts have 4 to 12 words, so one changed word removes most of a short prompt's 4-grams
#: while two prompts of one template ("Tell me a fun fact about elephants." / "... octopuses.") share 3 of
#: their 5; content words say what a prompt asks about. 0.45 is the threshold of ``near_duplicate``,
#: calibrated on these prompt sets: the held-out chat prompts reach 0.43 against a training prompt of the
#: same template and another subject (a different question), the held-out documents 0.06 at most.
THRESHOLD = 0.45
#: a run of this many words (casefolded) shared with a used prompt is a copied sentence; a new document
#: diluted around it keeps the content-word Jaccard low, so this catches what the index cannot
COPIED_RUN = 8


def _used() -> list[str]:
    """The prompts a held-out prompt must not resemble: the training / datastore pool and the tuning split."""
    return _pool() + [p for prompts in TUNING.values() for p in prompts]


def jaccard(first: str, second: str) -> float:
    a, b = prompt_grams(first), prompt_grams(second)
    return len(a & b) / len(a | b) if a or b else 1.0


def _runs(text: str) -> set[tuple[str, ...]]:
    words = text.casefold().split()
    return {tuple(words[i:i + COPIED_RUN]) for i in range(len(words) - COPIED_RUN + 1)}


def similar(benchmark: dict[str, tuple[str, ...]], used: list[str]) -> set[tuple[str, str]]:
    """``(benchmark prompt, used prompt)`` for every pair at or above ``THRESHOLD`` or sharing a copied run."""
    used_runs = [(u, _runs(u)) for u in used]
    hits = set()
    for prompts in benchmark.values():
        for prompt in prompts:
            runs = _runs(prompt)
            hits |= {(prompt, u) for u, r in used_runs if jaccard(prompt, u) >= THRESHOLD or runs & r}
    return hits


def test_heldout_prompts_are_not_training_datastore_or_tuning_prompts() -> None:
    assert overlaps(HELDOUT, _used()) == []


def test_heldout_prompts_are_not_similar_to_training_datastore_or_tuning_prompts() -> None:
    assert similar(HELDOUT, _used()) == set()


def test_the_checks_catch_a_lightly_edited_tuning_prompt() -> None:
    """Negative control: a tuning prompt with one word changed (a long one) or added (a short one, whose one
    changed word may be a new subject), or a tuning sentence copied into a new document, is reported."""
    edited = []
    for prompt in (p for prompts in TUNING.values() for p in prompts):
        words = prompt.split()
        if len(words) >= 20:
            words[len(words) // 2] = "zebra"
        else:
            words.insert(1, "exactly")
        edited.append(" ".join(words))
    assert overlaps({"chat": tuple(edited)}, _used()) == []  # what the exact check alone would miss
    used = _used()
    assert {b for b, _ in similar({"planted": tuple(edited)}, used)} == set(edited)
    sentence = INPUT_GROUNDED[0].split("\n\n")[1].split(". ")[1]  # one sentence of the tuning passage
    planted = f"Summarise this text:\n\n{DOCUMENTS['narrative']} {sentence}."
    assert jaccard(planted, INPUT_GROUNDED[0]) < THRESHOLD  # the index alone would miss it
    assert {b for b, _ in similar({"input-grounded": (planted,)}, used)} == {planted}


def test_the_similarity_leaves_different_questions_apart() -> None:
    # two questions of one template about different subjects, and a held-out document against the tuning one
    assert jaccard("Tell me a fun fact about elephants.", "Tell me a fun fact about octopuses.") < THRESHOLD
    assert jaccard(HELDOUT["long"][0], LONG[0]) < THRESHOLD


def test_the_splits_partition_the_chat_prompts_and_tuning_is_what_defaults_ran() -> None:
    import bench.defaults

    assert TUNING["chat"] == HELDOUT_PROMPTS[:TUNING_CHAT_PROMPTS]
    assert TUNING_CHAT_PROMPTS >= 8  # bench/results/defaults.md ran --prompts 4; the margin allows reruns
    assert TUNING["chat"] + HELDOUT["chat"] == HELDOUT_PROMPTS
    assert bench.defaults.INPUT_GROUNDED is TUNING["input-grounded"] and bench.defaults.LONG is TUNING["long"]


def test_heldout_has_enough_prompts_and_documents_of_enough_kinds() -> None:
    assert set(HELDOUT) == set(TUNING) == {"chat", "input-grounded", "long"}
    assert len(HELDOUT["chat"]) >= 8
    kinds = {kind for kind, _ in INPUT_GROUNDED_TASKS}
    assert kinds == set(DOCUMENTS) and len(kinds) >= 8
    assert len({_normal(d) for d in DOCUMENTS.values()}) == len(DOCUMENTS)
    assert all(120 <= len(d.split()) <= 220 for d in DOCUMENTS.values())
    assert len(HELDOUT["input-grounded"]) == len(INPUT_GROUNDED_TASKS) >= 10
    for (kind, task), prompt in zip(INPUT_GROUNDED_TASKS, HELDOUT["input-grounded"]):
        assert prompt == f"{task}\n\n{DOCUMENTS[kind]}"
    assert 500 <= len(HELDOUT_LONG_DOCUMENT.split()) <= 700
    assert 2 <= len(HELDOUT["long"]) <= 4
    assert all(p.startswith(HELDOUT_LONG_DOCUMENT) for p in HELDOUT["long"])
    for split in (HELDOUT, TUNING):
        every = [_normal(p) for prompts in split.values() for p in prompts]
        assert len(set(every)) == len(every)
