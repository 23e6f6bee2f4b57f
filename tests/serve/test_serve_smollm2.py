"""The default server (SmolLM2-135M-Instruct on its GGUF blocks, the retrieval draft, the default strategy and
depth policy) decodes concurrent greedy requests together and replies exactly what ``spec_fast.generate``
replies to each alone."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="spec-fast serve needs the serve extra")
pytest.importorskip("openai")

from tests.serve.server import ServerProcess  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]

MAX_TOKENS = 40


def test_the_default_server_batches_smollm2_and_replies_as_generate_does() -> None:
    import spec_fast
    from spec_fast.drafts.prompts import HELDOUT_PROMPTS

    prompts = list(HELDOUT_PROMPTS[:4])
    with ServerProcess(["--max-batch", "4"]) as server:
        models = server.client().models.list()
        assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct"]
        start = threading.Barrier(len(prompts))

        def ask(prompt: str) -> object:
            start.wait(30)  # all four at once: they share the running batch
            return server.client().chat.completions.create(
                model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": prompt}],
                max_tokens=MAX_TOKENS, temperature=0)

        with ThreadPoolExecutor(len(prompts)) as pool:
            replies = list(pool.map(ask, prompts, timeout=300))
    alone = [spec_fast.generate(prompt, max_new_tokens=MAX_TOKENS) for prompt in prompts]
    for reply, expected in zip(replies, alone):
        choice = reply.choices[0]  # type: ignore[attr-defined]
        assert choice.message.content == expected.text
        assert reply.usage.completion_tokens == len(expected.tokens)  # type: ignore[attr-defined]
        assert choice.finish_reason == expected.finish_reason
    stats = [r.choices[0].model_extra["speculative_decoding"] for r in replies]  # type: ignore[attr-defined]
    assert {s["draft"] for s in stats} == {"retrieval"}
    # every pass emits its accepted draft tokens plus one (how deep to draft at batch 4 is the engine's
    # depth policy's choice: the default prices each step, and may not draft at all)
    for reply, s in zip(replies, stats):
        assert s["target_passes"] + s["accepted_tokens"] == reply.usage.completion_tokens  # type: ignore[attr-defined]
