"""The prompt sets of the drafts live in a data file (spec_fast/drafts/prompts.json): the loader returns
exactly the lists the committed drafts were trained on, in the same order, and rejects malformed data."""

from __future__ import annotations

import hashlib

import pytest

from spec_fast.drafts.prompts import (HELDOUT_PROMPTS, TRAIN_PROMPTS, load_prompt_sets, parse_prompt_sets,
                                      synthetic_prompts)

#: sha256 of "\n".join(list) and the list length, computed from the prompt tuples that were written in
#: spec_fast/training.py before they moved to the data file (the training data of the committed weights)
_OLD_DIGESTS = {
    "train": (120, "fcc4f586164e6e0ff940a986a280bf9d0705864ba88a1f8966bb1b5159b19bc9"),
    "heldout": (24, "cd7c9a0400c1737000a945b6d1389b2aa91c2e1a93c744f967a58fa1fe02b3b8"),
    "synthetic_templates": (24, "28b212ea18edbb7029254129d1474dc4697d0e4c3491e15e46ac4c3433858f5a"),
    "synthetic_subjects": (100, "c76cf5d10f52688444f939beb7c4f21914f3d096c2d0e8dc35c9f20a91072b9d"),
}

#: the same digest of synthetic_prompts(1400, 0) (the default training draw) and of (1600, 0), before the move
_OLD_SYNTHETIC = {1400: "7f228c006881c31d789d2b9408da1b6d0a919c16353ab743b8e28f3e85a800c2",
                  1600: "1ee6201e36e859f429ab9e0ddc89938c742c92ba1f45d22d125a881eeecb189e"}


def _digest(strings: tuple[str, ...] | list[str]) -> str:
    return hashlib.sha256("\n".join(strings).encode("utf-8")).hexdigest()


@pytest.mark.parametrize("key", sorted(_OLD_DIGESTS))
def test_loaded_prompt_sets_equal_the_old_in_code_lists(key: str) -> None:
    strings = getattr(load_prompt_sets(), key)
    assert isinstance(strings, tuple) and all(isinstance(s, str) for s in strings)
    assert (len(strings), _digest(strings)) == _OLD_DIGESTS[key]


def test_module_constants_are_the_loaded_sets() -> None:
    assert TRAIN_PROMPTS == load_prompt_sets().train
    assert HELDOUT_PROMPTS == load_prompt_sets().heldout


@pytest.mark.parametrize("count", sorted(_OLD_SYNTHETIC))
def test_synthetic_prompts_draw_the_same_prompts_in_the_same_order(count: int) -> None:
    assert _digest(synthetic_prompts(count, 0)) == _OLD_SYNTHETIC[count]


def test_a_reordered_set_changes_the_digest() -> None:
    """Negative control: the digest check notices a swap of two prompts."""
    train = list(load_prompt_sets().train)
    train[0], train[1] = train[1], train[0]
    assert _digest(train) != _OLD_DIGESTS["train"][1]


def _valid() -> dict[str, object]:
    return {"train": ["a?"], "heldout": ["b?"], "synthetic_templates": ["What is {s}?"],
            "synthetic_subjects": ["x"]}


@pytest.mark.parametrize("bad, message", [
    ([], "JSON object"),
    ({**_valid(), "train": []}, "'train'"),
    ({**_valid(), "heldout": "b?"}, "'heldout'"),
    ({k: v for k, v in _valid().items() if k != "synthetic_subjects"}, "'synthetic_subjects'"),
    ({**_valid(), "train": ["a?", 3]}, "'train'"),
    ({**_valid(), "synthetic_templates": ["no subject"]}, "template='no subject'"),
])
def test_malformed_prompt_sets_are_rejected_naming_the_field(bad: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_prompt_sets(bad)
    assert parse_prompt_sets(_valid()).synthetic_templates == ("What is {s}?",)
