"""Training stays off the runtime path: importing the engine, the CLI and the one-call API (and every draft
they load by name) never imports :mod:`spec_fast.drafts.training`; the public names of
:mod:`spec_fast.drafts` resolve to the modules that define them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_TRAINING = "spec_fast.drafts.training"

_PROBE = f"""
import json, sys
import spec_fast.engine, spec_fast.cli, spec_fast.api
import spec_fast.drafts.heads, spec_fast.drafts.retrieval, spec_fast.drafts.dual, spec_fast.drafts.prompts
runtime = {_TRAINING!r} in sys.modules
import {_TRAINING}
print(json.dumps({{"runtime": runtime, "after_explicit_import": {_TRAINING!r} in sys.modules}}))
"""


def test_runtime_modules_do_not_import_the_training_module() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, cwd=root,
                          timeout=300, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["runtime"] is False
    assert seen["after_explicit_import"] is True  # control: the same probe sees the module once imported


@pytest.mark.parametrize("name", ["Drafter", "EarlyExitDrafter", "ModelDrafter", "DualDrafter", "HeadDrafter",
                                  "RetrievalDrafter", "HybridDrafter", "load_drafter", "HELDOUT_PROMPTS"])
def test_public_draft_names_resolve_from_the_package(name: str) -> None:
    import spec_fast
    import spec_fast.drafts as drafts

    value = getattr(drafts, name)
    assert value is getattr(sys.modules[drafts._EXPORTS[name]], name)
    if name in spec_fast._EXPORTS:
        assert getattr(spec_fast, name) is value
    with pytest.raises(AttributeError, match="no attribute"):
        getattr(drafts, "train_head")
