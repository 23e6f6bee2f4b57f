"""SmolLM2 is loaded once per session for the ``model`` tests of the trained drafts."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def smollm2_target() -> Any:
    import torch  # here, not at module level: the directory must collect (and skip) without torch

    from spec_fast.models import load_model

    torch.set_num_threads(1)
    return load_model()
