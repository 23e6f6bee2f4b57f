"""``spec-fast serve`` from the shell: generate's model flags shared, every mistake one line and exit 2
before anything heavy loads, a model that fails to load ends the server with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spec_fast.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_serve_shares_generates_model_flags_and_their_defaults() -> None:
    from spec_fast.serve.cli import SHARED_FLAGS

    parser = build_parser()
    serve = vars(parser.parse_args(["serve"]))
    generate = vars(parser.parse_args(["generate", "x"]))
    assert {name: serve[name] for name in SHARED_FLAGS} == {name: generate[name] for name in SHARED_FLAGS}
    assert (serve["host"], serve["port"], serve["max_batch"]) == ("127.0.0.1", 8000, 4)
    parsed = vars(parser.parse_args(["serve", "--draft", "none", "--strategy", "ar", "--threads", "2"]))
    assert (parsed["draft"], parsed["strategy"], parsed["threads"]) == ("none", "ar", 2)
    assert "temperature" not in serve  # sampling settings come with each request
    assert serve["depth_policy"] == "cost"


def test_depth_policies_match_the_engines() -> None:
    from spec_fast.engine.batch_engine import DEPTH_POLICIES
    from spec_fast.serve.cli import DEPTH_POLICIES as SERVE_POLICIES

    assert SERVE_POLICIES == DEPTH_POLICIES


@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "--port: must be an integer in [0, 65535]"),
    (["--max-batch", "0"], "--max-batch: must be an integer >= 1"),
    (["--max-queue", "-1"], "--max-queue: must be an integer >= 0"),
    (["--api-key", " "], "--api-key: must not be empty"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout"),
    (["--strategy", "bogus"], "--strategy: unknown strategy"),
    (["--model", "/no/such/folder"], "--model: no such file or folder"),
    (["--threads", "0"], "--threads: must be an integer >= 1"),
    (["--draft", "early-exit:x"], "--draft: early-exit:N"),
])
def test_bad_flags_are_one_line_and_exit_2_before_anything_loads(capsys: pytest.CaptureFixture[str],
                                                                 args: list[str], message: str) -> None:
    assert main(["serve", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("spec-fast: error: " + message) and captured.err.count("\n") == 1, captured.err


def test_serve_help_imports_neither_torch_nor_the_web_stack() -> None:
    from tests.engine.test_shell import imported_modules

    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "spec_fast", "serve", "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and "usage: spec-fast serve" in proc.stdout
    assert "--max-batch" in proc.stdout and "--strategy" in proc.stdout
    assert not imported_modules(proc.stderr) & {"torch", "transformers", "fastapi", "uvicorn", "starlette"}


def test_a_model_that_fails_to_load_stops_the_server_with_one_line(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn", reason="spec-fast serve needs the serve extra")
    pytest.importorskip("httpx")
    from tests.serve.server import ServerProcess

    empty = tmp_path / "not-a-model"
    empty.mkdir()
    server = ServerProcess(["--model", str(empty), "--draft", "none"])
    with pytest.raises(AssertionError, match="exited with 2 before it was healthy") as caught:
        with server:
            pass
    log = str(caught.value)  # the server's stderr
    errors = [line for line in log.splitlines() if line.startswith("spec-fast: error:")]
    assert len(errors) == 1 and "Traceback" not in log, log
