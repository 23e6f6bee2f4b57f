"""SmolLM2 is loaded once per session for the ``model`` tests of the trained drafts."""

from __future__ import annotations

from typing import Any

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2_target() -> Any:
    from spec_fast.models import load_model

    torch.set_num_threads(1)
    return load_model()
