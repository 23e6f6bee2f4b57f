"""Servers shared by the serve tests: one tiny-model server for the whole session (the API and load tests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the server helper needs httpx (the test extra); each test module skips without it
    from tests.serve.server import ServerProcess

API_KEY = "test-key"
#: the tiny model's context (positions): small enough that the context tests need no large prompt
CONTEXT = 1024
#: a draft and a fixed strategy (no +adaptive, the strategy's depth at every step): a seeded sampled reply is
#: then the one it gets alone, whatever shares the batch
TINY_ARGS = ["--draft", "early-exit:2", "--strategy", "chain:3", "--depth-policy", "fixed"]


@pytest.fixture(scope="session")
def tiny_serve_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random tiny Llama with a character-level tokenizer and chat template (tests/engine/models.py)."""
    from tests.engine.models import save_tiny_chat_model

    return save_tiny_chat_model(str(tmp_path_factory.mktemp("tiny-serve-model")), max_positions=CONTEXT)


@pytest.fixture(scope="session")
def tiny_server(tiny_serve_model_dir: str) -> Iterator[ServerProcess]:
    from tests.serve.server import ServerProcess

    server = ServerProcess(["--model", tiny_serve_model_dir, *TINY_ARGS, "--max-batch", "4", "--max-queue", "32",
                            "--served-model-name", "tiny"], api_key=API_KEY)
    with server:
        yield server
