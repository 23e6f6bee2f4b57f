"""scripts/train_drafts.py reloads its teacher-data cache with ``torch.load(weights_only=True)``: a cache file
holding anything but tensors and plain containers is refused instead of being unpickled as code."""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_drafts.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_drafts_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Payload:
    """Any class: unpickling it with weights_only=False would run its module's code."""


def test_a_cache_of_tensors_and_containers_reloads(tmp_path: Path) -> None:
    cache = {"key": "k", "pairs": [([1, 2], [3])], "data": {"tokens": torch.arange(4)}}
    torch.save(cache, tmp_path / "cache.pt")
    loaded = _script().load_data_cache(str(tmp_path / "cache.pt"))
    assert loaded["key"] == "k" and torch.equal(loaded["data"]["tokens"], torch.arange(4))


def test_a_cache_holding_an_arbitrary_object_is_refused(tmp_path: Path) -> None:
    torch.save({"key": "k", "payload": Payload()}, tmp_path / "cache.pt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        _script().load_data_cache(str(tmp_path / "cache.pt"))
