"""Keyword names that differ between transformers releases.

transformers 5.24 renamed the cache argument of every model, layer and attention ``forward`` from
``past_key_values`` to ``cache`` (the old name still works until 5.40 but warns on every call). The
engine passes its cache by keyword to HF modules and to its own lean model, so it asks each callable
once which name it takes instead of pinning one transformers release.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

__all__ = ["cache_keyword"]


def cache_keyword(forward: Callable[..., Any]) -> str:
    """``"cache"`` where ``forward`` takes a parameter of that name, else ``"past_key_values"``.

    Call it once per model (signature inspection costs tens of microseconds), not once per pass.
    """
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature: the old name
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"
