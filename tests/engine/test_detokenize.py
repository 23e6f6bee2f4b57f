"""The incremental text of a growing reply (spec_fast/detokenize.py), which the batch engine and the CLI's
stream use instead of decoding the whole reply at every step.

* after every push its text is exactly ``tokenizer.decode(tokens, skip_special_tokens=True)``: with
  SmolLM2's byte-level BPE tokenizer on real text (multi-byte characters, emoji sequences, whitespace runs)
  and on random ids (special tokens, lone bytes of a UTF-8 character), pushed in chunks of 1-5 tokens; and
  with decoders that rewrite text across tokens (a clean-up rule, a SentencePiece-style leading-space
  strip), and with one whose rule spans the whole text, where the check falls back to whole decodes;
* the tokens it decodes per push do not grow with the reply (the whole decodes made the stream quadratic).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from spec_fast.detokenize import IncrementalText

TEXT = ("Speculative decoding, explained: a draft proposes; the target verifies. Héllo wörld, 日本語のテキスト, "
        "emoji 🎉🎉 and a family 👩‍👩‍👧 .\n\n  spaced   out , . ! ?\n\tdone.\n") * 6


class CountingTokenizer:
    """Wraps a tokenizer and counts the ids it is asked to decode."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.decoded = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.decoded += len(ids)
        return str(self.inner.decode(ids, skip_special_tokens=skip_special_tokens))


class WordTokenizer:
    """Ids index a small vocabulary of words; ``decode`` joins them and then rewrites ``" ."`` and ``" ,"`` into
    ``"."`` and ``","`` (transformers' clean-up of tokenization spaces) and, with ``strip``, drops the first
    token's leading space (SentencePiece's rule): neither is local to a token."""

    VOCAB = [" the", " cat", " .", " ,", " sat", " ", "mat", " on", "\n", " a", ".", ","]

    def __init__(self, strip: bool) -> None:
        self.strip = strip

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = "".join(self.VOCAB[i] for i in ids).replace(" .", ".").replace(" ,", ",")
        return text[1:] if self.strip and text.startswith(" ") else text


def _check_stream(tokenizer: Any, ids: list[int], seed: int, most: int = 5) -> IncrementalText:
    chunks = random.Random(seed)
    stream = IncrementalText(tokenizer)
    done = 0
    while done < len(ids):
        step = chunks.randint(1, most)
        stream.extend(ids[done:done + step])
        done = min(len(ids), done + step)
        assert stream.text() == tokenizer.decode(ids[:done], skip_special_tokens=True), done
    return stream


def test_the_text_equals_the_whole_decode_after_every_push_on_smollm2s_tokenizer(smollm2: Any) -> None:
    tokenizer = smollm2[1]
    real = list(tokenizer(TEXT)["input_ids"])
    stream = _check_stream(tokenizer, real, 0)
    assert stream.full_decodes == 0 and stream.settled > len(real) - 40  # real text settles as it goes
    draws = random.Random(1)
    noise = [draws.randrange(49152) for _ in range(400)]  # lone UTF-8 bytes and special tokens among them
    specials = [draws.choice([0, 1, 2]) for _ in range(60)]
    _check_stream(tokenizer, noise, 2)
    _check_stream(tokenizer, specials + real[:200] + specials, 3)


@pytest.mark.parametrize("strip", [False, True])
def test_decoders_that_rewrite_text_across_tokens_keep_the_whole_decodes_text(strip: bool) -> None:
    tokenizer = WordTokenizer(strip)
    draws = random.Random(4)
    ids = [draws.randrange(len(WordTokenizer.VOCAB)) for _ in range(300)]
    stream = _check_stream(tokenizer, ids, 5)
    stream.truncate(120)  # a stop string cut the reply: the text is that of the kept tokens
    assert stream.text() == tokenizer.decode(ids[:120])
    # a settled point never lands where the clean-up would still pull the next token's text back over it:
    # settling waits until the text of the prefix is a prefix of the whole text
    forced = [0, 1] * 7 + [4, 5, 10] + [0, 1] * 12
    stream = _check_stream(tokenizer, forced, 6, most=1)
    assert stream.settled_text == tokenizer.decode(forced[:stream.settled])


def test_a_rule_over_the_whole_text_falls_back_to_whole_decodes() -> None:
    """A decoder whose text depends on tokens far back (everything upper-cased once a "!" occurs) breaks
    the window's identity: the check sees it, and the text is the whole decode's."""

    class Shouting(WordTokenizer):
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            text = "".join("!" if i == len(self.VOCAB) else self.VOCAB[i] for i in ids)
            return text.upper() if "!" in text else text

    ids = [0, 1, 4, 7, 9, 6] * 12 + [len(WordTokenizer.VOCAB)] + [0, 1] * 10
    stream = _check_stream(Shouting(False), ids, 7)
    assert stream.full_decodes > 0 and stream.text() == Shouting(False).decode(ids)


def test_the_tokens_decoded_per_push_do_not_grow_with_the_reply(smollm2: Any) -> None:
    counting = CountingTokenizer(smollm2[1])
    ids = list(smollm2[1](TEXT * 2)["input_ids"])[:2000]
    stream = IncrementalText(counting)
    for i in range(len(ids)):
        stream.extend(ids[i:i + 1])
        stream.text()
    # a window holds at most context + 2 lag tokens; settling decodes two more windows every lag pushes
    assert counting.decoded <= len(ids) * (2 * 16 + 2 * 4 + 2 * (16 + 4 + 4))
    assert counting.decoded < len(ids) ** 2 / 20  # whole decodes: len(ids)^2 / 2


def test_bad_window_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="^context and lag must be >= 1"):
        IncrementalText(WordTokenizer(False), context=0)


def test_first_stop_finds_the_earliest_stop_string_and_the_token_that_completed_it() -> None:
    detok = IncrementalText(WordTokenizer(strip=False))
    detok.extend([0, 1, 4, 7, 0, 5, 6, 2, 9, 1])  # " the cat sat on the mat. a cat"
    text = detok.text()
    assert text == " the cat sat on the mat. a cat"
    # "mat" is completed by the 7th token; " cat" by the 2nd, which the search from 0 finds first
    assert detok.first_stop(text, ["mat", "zzz"], 0) == (text.find("mat"), 7)
    assert detok.first_stop(text, [" cat", "mat"], 0) == (text.find(" cat"), 2)
    # tokens up to `since` are taken to hold no stop string (their text, " the cat sat on the mat.", holds no
    # "a cat"): the search starts after them
    assert detok.first_stop(text, ["a cat"], 8) == (text.find("a cat"), 10)
    assert detok.first_stop(text, ["dog"], 0) == (-1, None)


def test_final_length_holds_an_unfinished_character_and_a_stop_prefix_before_it() -> None:
    from spec_fast.detokenize import final_length

    assert final_length("Hello ##", ["###"]) == len("Hello ")
    # the stop string's prefix sits before half a character: both are held (the next tokens may finish the
    # character, and a later "#" may still complete the stop string after it is dropped)
    assert final_length("Hello ##\ufffd", ["###"]) == len("Hello ")
    assert final_length("Hello \ufffd\ufffd", ["END"]) == len("Hello ")
    assert final_length("Hello E", ["END", "Ex"]) == len("Hello ")
    assert final_length("Hello EN", ["END", "\n\n"]) == len("Hello ")
    assert final_length("Hello", ["END"]) == len("Hello")
    assert final_length("Hello", []) == len("Hello")
    assert final_length("\ufffd", ["#"]) == 0
