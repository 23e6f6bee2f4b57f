"""SmolLM2 is loaded once per session (about 15 s on the 2-core CI machine)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def smollm2() -> Any:
    from spec_fast.models import load_model

    return load_model()
