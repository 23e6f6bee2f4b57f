"""SmolLM2 is loaded once per session (about 15 s on the 2-core CI machine)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def smollm2() -> Any:
    from spec_fast.models import load_model

    return load_model()


@pytest.fixture(scope="session")
def tiny_chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random tiny Llama + character tokenizer saved as an HF model folder (tests/engine/models.py)."""
    from tests.engine.models import save_tiny_chat_model

    return save_tiny_chat_model(str(tmp_path_factory.mktemp("tiny-chat-model")))
