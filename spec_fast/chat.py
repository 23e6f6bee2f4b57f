"""Token ids of chat messages through a tokenizer's chat template (the assistant turn opened).

:func:`template_ids` is the one call to ``apply_chat_template``; :func:`chat_prompt_ids` wraps one user text
(benchmarks, training, scripts: it falls back to the plain text when the tokenizer has no template, so base
models work too), and :func:`spec_fast.api.prompt_ids` refuses a missing template with a setting error (the
user asked for chat).
"""

from __future__ import annotations

from typing import Any

__all__ = ["template_ids", "chat_prompt_ids"]


def template_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` through ``tokenizer``'s chat template, the assistant turn opened."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def chat_prompt_ids(tokenizer: Any, text: str, system: str | None = None, chat: bool = True) -> list[int]:
    """Token ids of ``text``, wrapped in the tokenizer's chat template (with the assistant turn opened);
    the plain text's ids with ``chat=False`` or when the tokenizer has no template."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("prompt must be a non-empty string, got an empty prompt")
    if chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text})
        return template_ids(tokenizer, messages)
    return [int(t) for t in tokenizer(text)["input_ids"]]
