"""``spec-fast generate`` as a shell user meets it: the real entry point ``python -m spec_fast`` in a
subprocess, on a tiny random model folder (tests/engine/models.py) unless the default model is the point.

Each test is one way the command line failed a new user before: a slow ``--help``, errors reported only
after a model load, tracebacks, unparseable ``--json``, no stdin, no stop strings, Ctrl-C and ``| head``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(args: list[str], stdin: str | None = "", timeout: float = 120.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spec_fast", *args], input=stdin, capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env=dict(os.environ), **kwargs)


def imported_modules(importtime_stderr: str) -> set[str]:
    """Top-level names of the modules that ``python -X importtime`` reports as imported."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_help_imports_neither_torch_nor_transformers() -> None:
    # --help used to take 7.7 s: every heavy import now waits until a model is needed
    for args in (["--help"], ["generate", "--help"]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "spec_fast", *args], capture_output=True,
                              text=True, cwd=ROOT, timeout=60)
        assert proc.returncode == 0 and "usage: spec-fast" in proc.stdout
        modules = imported_modules(proc.stderr)
        assert "spec_fast" in modules  # the parser really ran under -X importtime
        assert not modules & {"torch", "transformers", "scipy"}, modules & {"torch", "transformers", "scipy"}


@pytest.mark.parametrize(
    "args,message",
    [
        (["generate", "hi", "--strategy", "tree:9"], "--strategy: unknown strategy 'tree:9'"),
        (["generate", "hi", "--strategy", "topk:3,2,6", "--verifier", "bv"], "--verifier"),
        (["generate", "hi", "--temperature", "-1"], "--temperature"),
        (["generate", "hi", "--top-p", "1.5"], "--top-p"),
        (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["generate", "hi", "--threads", "0"], "--threads"),
        (["generate", "hi", "--draft", "retreival"], "--draft: 'retreival' is not a draft name"),
        (["generate", "hi", "--draft", "early-exit:x"], "--draft: early-exit:N"),
        (["generate", "hi", "--model", "./no-such-model"], "--model: no such file or folder"),
        (["generate", "hi", "--model", "no-such-model"], "neither a local folder nor a model hub id"),
        (["generate", "hi", "--draft", "/no/such/draft"], "--draft"),
        (["generate", "hi", "--stop", ""], "--stop"),
        (["generate", "hi", "--device", "gpu"], "--device"),
        (["generate", "hi", "--draft", "none", "--strategy", "chain:2"], "needs a draft"),
        (["generate", "hi", "--temperature", "0.7", "--verifier", "greedy", "--strategy", "chain:2"], "greedy"),
        (["generate", "   "], "PROMPT: must be a non-empty string"),
        (["generate", "hi", "--top-k", "two"], "invalid int value"),
        (["generate", "hi", "--dtype", "float8"], "invalid choice"),
    ],
)
def test_a_user_error_is_one_line_with_status_2_before_any_model_loads(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "spec_fast", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=60, input="")
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2, proc.stderr
    assert len(errors) == 1 and errors[0].startswith("spec-fast"), errors
    assert message in errors[0]
    assert proc.stdout == ""
    # checked before torch (let alone a model, or a model hub) is touched
    assert not imported_modules(proc.stderr) & {"torch", "transformers"}


def test_a_folder_without_a_model_is_read_locally_and_refused_in_one_line(tmp_path: Any) -> None:
    # an existing folder is read with local_files_only: no hub retries (the issue saw ~80 s and a traceback)
    start = time.perf_counter()
    proc = run_cli(["generate", "hi", "--model", str(tmp_path), "--draft", "none"], timeout=90)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("spec-fast: error:")
    assert time.perf_counter() - start < 60


def test_json_is_exactly_one_object_on_stdout(tiny_chat_model_dir: str) -> None:
    proc = run_cli(["generate", "hello", "--model", tiny_chat_model_dir, "--draft", "early-exit:2",
                    "--strategy", "chain:2", "--max-new-tokens", "12", "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # the whole of stdout parses: no text before or after
    assert set(out) == {"text", "tokens", "finish_reason", "metrics", "settings"}
    assert 1 <= len(out["tokens"]) <= 12 and isinstance(out["text"], str)
    for name in ("block_efficiency", "tokens_per_s", "generated_tokens", "target_passes", "ttft_s"):
        assert name in out["metrics"]
    assert out["settings"]["strategy"] == "chain:2/naive" and out["settings"]["max_new_tokens"] == 12
    assert "Traceback" not in proc.stderr


def test_the_prompt_comes_from_stdin_and_the_text_streams_plainly_to_stdout(tiny_chat_model_dir: str) -> None:
    import spec_fast

    reference = spec_fast.generate("hello there", model=tiny_chat_model_dir, draft="none", max_new_tokens=16)
    proc = run_cli(["generate", "-", "--model", tiny_chat_model_dir, "--draft", "none", "--max-new-tokens", "16"],
                   stdin="hello there")
    assert proc.returncode == 0, proc.stderr
    # plain streaming: exactly the text and a newline on stdout, no control codes; one summary line on stderr
    assert proc.stdout == reference.text + "\n"
    assert "\x1b" not in proc.stdout and "\r" not in proc.stderr
    assert "tok/s" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_an_absent_prompt_is_read_from_stdin(tiny_chat_model_dir: str, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import io

    import spec_fast
    from spec_fast.cli import main

    reference = spec_fast.generate("hello there", model=tiny_chat_model_dir, draft="none", max_new_tokens=16)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello there"))
    assert main(["generate", "--model", tiny_chat_model_dir, "--draft", "none", "--max-new-tokens", "16",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == reference.text and out["tokens"] == reference.tokens


def test_stop_strings_end_the_text_before_the_stop_string(tiny_chat_model_dir: str) -> None:
    import spec_fast

    settings: dict[str, Any] = {"model": tiny_chat_model_dir, "draft": "early-exit:2", "strategy": "chain:3",
                                "max_new_tokens": 40}
    full = spec_fast.generate("hello", **settings)
    text = full.text
    assert len(text) >= 12, text  # the tiny model's <eos> logit is 0: rarely the argmax
    stop = text[8:11]
    cut = text.index(stop)
    stopped = spec_fast.generate("hello", stop=[stop, "never-in-this-text"], **settings)
    assert stopped.text == text[:cut] and stopped.finish_reason == "stop"
    # the tokens end with the one that completed the stop string (greedy: a prefix of the full run)
    assert stopped.tokens == full.tokens[: cut + len(stop)]  # one character per token in this tokenizer
    proc = run_cli(["generate", "hello", "--model", tiny_chat_model_dir, "--draft", "early-exit:2", "--strategy",
                    "chain:3", "--max-new-tokens", "40", "--stop", stop])
    assert proc.returncode == 0 and proc.stdout == text[:cut] + "\n", proc.stderr


def test_a_closed_pipe_ends_quietly(tiny_chat_model_dir: str, tmp_path: Any) -> None:
    err = tmp_path / "stderr.txt"
    cmd = (f"{sys.executable} -m spec_fast generate hello --model {tiny_chat_model_dir} --draft none "
           f"--max-new-tokens 3000 2>{err} | head -c 20")
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert len(proc.stdout) == 20
    assert proc.returncode == 1, err.read_text()  # Python's convention for EPIPE; no traceback
    assert err.read_text() == ""


def test_ctrl_c_ends_quietly_with_status_130(tiny_chat_model_dir: str) -> None:
    # Ctrl-C in a terminal reaches a process whose SIGINT disposition is the default. A test runner started
    # in the background of a non-interactive shell (as CI may be) has SIGINT ignored, the child inherits
    # that, and Python then installs no KeyboardInterrupt handler: restore the default in the child.
    proc = subprocess.Popen([sys.executable, "-m", "spec_fast", "generate", "hello", "--model", tiny_chat_model_dir,
                             "--draft", "none", "--max-new-tokens", "4000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    proc.stdout.read(5)  # decoding has started
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr


@pytest.mark.model
def test_the_default_model_runs_from_a_fresh_cache_and_then_from_the_cache(tmp_path: Any) -> None:
    env = {**os.environ, "SPEC_FAST_CACHE": str(tmp_path / "cache")}
    args = [sys.executable, "-m", "spec_fast", "generate", "Name a colour.", "--max-new-tokens", "8"]
    first = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert first.returncode == 0, first.stderr
    # the default runs the file's own blocks: the first run reads only the tokenizer (one note, no progress
    # bar) and de-quantises nothing
    assert "tokenizer once" in first.stderr and "it/s" not in first.stderr and "de-quantising" not in first.stderr
    entries = [e for e in os.listdir(tmp_path / "cache") if e != "kernels"]  # kernels: the built native kernel
    assert len(entries) == 1 and entries[0].startswith("SmolLM2-135M-Instruct.Q4_1-tokenizer-")
    second = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert second.returncode == 0 and "tokenizer once" not in second.stderr
    assert second.stdout == first.stdout and len(second.stderr.strip().splitlines()) == 1


def test_the_live_status_is_one_line_rewritten_in_place_on_a_terminal(tiny_chat_model_dir: str) -> None:
    # the old rich display printed a line per step; now stderr (a terminal here) gets one status line,
    # rewritten with \r and erased at the end, then the one summary line; stdout (a pipe) gets the text
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "spec_fast", "generate", "hello", "--model", tiny_chat_model_dir,
                             "--draft", "none", "--max-new-tokens", "400"], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, cwd=ROOT)
    os.close(slave)
    stdout, _ = proc.communicate(timeout=300)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    stderr = b"".join(chunks).decode()
    assert proc.returncode == 0, stderr
    assert "\r\x1b[K" in stderr and "tokens/target pass" in stderr  # the live line was shown
    final = stderr.rsplit("\r\x1b[K", 1)[1]  # after the live line was erased: only the summary line
    assert final.startswith("spec-fast: ") and final.strip().count("\n") == 0 and "tok/s" in final
    assert stderr.count("\n") == 1  # one line in all (a pty turns \n into \r\n)
    assert len(stdout.decode()) > 300 and b"\x1b" not in stdout
