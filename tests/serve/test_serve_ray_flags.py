"""``spec-fast serve --ray``'s flags: every mistake is one line and exit 2 before Ray or the model is touched,
and ``--ray`` without Ray installed says how to install it. None of these start Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spec_fast.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, message", [
    (["--replicas", "2"], "--replicas: needs --ray"),
    (["--ray-address", "auto"], "--ray-address: needs --ray"),
    (["--autoscale", "1:2"], "--autoscale: needs --ray"),
    (["--ray", "--replicas", "0"], "--replicas: must be an integer >= 1"),
    (["--ray", "--autoscale", "3:1"], "--autoscale: must be MIN:MAX with 1 <= MIN <= MAX"),
    (["--ray", "--autoscale", "0:2"], "--autoscale: must be MIN:MAX"),
    (["--ray", "--autoscale", "two"], "--autoscale: must be MIN:MAX"),
    (["--ray", "--replicas", "2", "--autoscale", "1:2"], "--autoscale: and --replicas exclude each other"),
    (["--ray", "--ray-address", "headnode"], "--ray-address: must be 'auto' or HOST:PORT"),
    (["--ray", "--ray-start-timeout", "0"], "--ray-start-timeout: must be a number of seconds > 0"),
    (["--ray", "--port", "70000"], "--port: must be an integer in [0, 65535]"),  # serve's own checks still apply
])
def test_bad_ray_flags_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str],
                                               message: str) -> None:
    assert main(["serve", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("spec-fast: error: " + message) and captured.err.count("\n") == 1, captured.err


def test_ray_without_the_ray_extra_says_how_to_install_it() -> None:
    # None in sys.modules makes `import ray` fail as if Ray were not installed
    code = "import sys; sys.modules['ray'] = None; from spec_fast.cli import main; sys.exit(main(['serve', '--ray']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("spec-fast: error: --ray needs the ray extra (ray is missing): "
                           "pip install 'spec-verify[ray]'\n"), proc.stderr
