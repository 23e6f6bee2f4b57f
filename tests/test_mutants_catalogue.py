"""The mutation catalogue (scripts/mutants.py) cannot rot: every patch still applies exactly once to the
current source and names existing tests, and the quick subset is killed. The full run is slow and lives
outside CI; its result is committed in bench/results/mutants.md."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutants.py"


def _catalogue() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutants_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_every_catalogued_mutant_applies_to_the_current_source() -> None:
    mutants = _catalogue()
    assert mutants.check_catalogue() == []
    assert len(mutants.CATALOGUE) >= 30
    assert any(m.fast for m in mutants.CATALOGUE)
    files = {m.path for m in mutants.CATALOGUE}
    assert {"spec_ref/verify.py", "spec_ref/solvers.py", "spec_fast/verify/solvers.py", "spec_fast/kv_cache.py"} <= files


def test_a_patch_that_no_longer_applies_is_reported(tmp_path: Path) -> None:
    mutants = _catalogue()
    (tmp_path / "spec_ref").mkdir()
    (tmp_path / "spec_ref" / "_sampling.py").write_text("nothing to mutate here\n")
    problems = mutants.check_catalogue(tmp_path)
    assert any(p.startswith("accept-non-strict: the old text occurs 0 times") for p in problems)


@pytest.mark.slow
def test_the_fast_subset_of_mutants_is_killed() -> None:
    """The issue's three mutants that the suite once let through, plus one reference mutant (~40 s)."""
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--fast", "--no-write"], cwd=SCRIPT.parents[1], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 of 4 mutants killed" in proc.stdout


def test_the_baseline_reports_tests_that_already_fail(tmp_path: Path) -> None:
    """A test failing on the unmutated source would count as a kill: the baseline names it (the control: a
    passing test gives exit status 0 and no failures)."""
    mutants = _catalogue()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_probe.py").write_text("def test_ok():\n    pass\n\n\ndef test_broken():\n    assert False\n")
    code, failing, _ = mutants.baseline(tmp_path, ["tests/test_probe.py::test_broken"], 120)
    assert code == 1 and failing == ["tests/test_probe.py::test_broken"]
    code, failing, _ = mutants.baseline(tmp_path, ["tests/test_probe.py::test_ok"], 120)
    assert code == 0 and failing == []


def test_the_run_refuses_when_the_baseline_fails(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    mutants = _catalogue()
    monkeypatch.setattr(mutants, "copy_repository", lambda destination: None)
    monkeypatch.setattr(mutants, "baseline", lambda copy, tests, timeout: (1, ["tests/x.py::test_y"], ""))
    monkeypatch.setattr(mutants, "run_one", lambda *args: pytest.fail("a mutant ran after a failing baseline"))
    assert mutants.main(["--only", "accept-non-strict", "--no-write"]) == 2
    err = capsys.readouterr().err
    assert "do not pass on the unmutated source" in err and "tests/x.py::test_y" in err


def test_the_union_of_tests_keeps_each_once_and_drops_node_ids_of_listed_files() -> None:
    mutants = _catalogue()
    chosen = [m for m in mutants.CATALOGUE if m.name in ("native-block-offset-subtracted", "native-activations-truncated",
                                                         "inverse-cdf-left", "accept-non-strict")]
    assert mutants.union_of_tests(chosen) == [
        "tests/ref/test_rng_and_inputs.py", "tests/fast/test_kernels_parity.py",
        "tests/engine/test_lean.py::test_block_quantised_products_use_the_stored_weights_and_each_row_ignores_the_others"]
