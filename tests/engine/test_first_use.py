"""A new user's first runs: each test is one surprise that used to happen.

Non-UTF-8 bytes in an argument, on stdin or in the Python API crashed inside the tokenizer with a
TypeError traceback; settings the engine refuses (``--strategy nde`` with the model-free default draft,
``--dual`` with a tree strategy) failed only after the model loaded; ``--stop "\\n"`` as typed never matched;
more threads than cores got no warning; a plain (``ar``) run reported a draft; the live tok/s counted the
model load; the engine API ran at torch's default thread count and wrote a 517 MB cache file silently;
there was no ``--version``; an offline ``org/name`` retried for 51 s.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import types
from typing import Any

import pytest
import torch

from spec_fast import api, cli, models
from spec_fast.settings import SettingError, cpu_cores, resolve_settings, thread_warning, unescape
from tests.engine.test_shell import ROOT, imported_modules


def _cli(args: list[bytes | str], stdin: bytes = b"",
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "spec_fast", *args], input=stdin,
                          capture_output=True, cwd=ROOT, timeout=120, env={**os.environ, **(env or {})})


def _one_error_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    stderr = proc.stderr.decode("utf-8", "replace")
    errors = [line for line in stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2, stderr
    assert len(errors) == 1 and errors[0].startswith("spec-fast: error: "), errors
    assert proc.stdout == b""
    return errors[0]


@pytest.mark.parametrize("where", ["argument", "argument --json", "stdin", "--stop", "--system"])
def test_non_utf8_input_is_one_line_error_before_any_model_loads(where: str) -> None:
    bad = b"Hi \xff there"
    args: list[bytes | str] = ["generate"]
    stdin = b""
    if where.startswith("argument"):
        args += [bad] + (["--json"] if "json" in where else [])
    elif where == "stdin":
        args += ["-"]
        stdin = bad
    else:
        args += ["hi", where, bad]
    line = _one_error_line(_cli(args, stdin))
    assert "not valid UTF-8" in line and "0xff" in line, line
    # refused before torch is imported (let alone a model loaded)
    assert not imported_modules(_cli(args, stdin).stderr.decode("utf-8", "replace")) & {"torch", "transformers"}


def test_the_api_decodes_utf8_bytes_and_refuses_other_bytes_naming_the_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    assert api.prompt_messages("Grüße".encode()) == [{"role": "user", "content": "Grüße"}]
    for prompt in (b"Hi \xff", "Hi \udcff", [{"role": "user", "content": "Hi \udcff"}]):
        with pytest.raises(SettingError, match=r"^prompt: is not valid UTF-8 text"):
            api.prompt_messages(prompt)  # type: ignore[arg-type]
    monkeypatch.setattr(api, "load_decoder", lambda *a, **k: pytest.fail("loaded a model for a bad prompt"))
    with pytest.raises(SettingError, match=r"^prompt: is not valid UTF-8"):
        api.generate(b"\xff\xfe")  # the prompt is checked before any load


@pytest.mark.parametrize(("kwargs", "name", "message"), [
    ({"strategy": "nde"}, "strategy", "hidden states"),
    ({"strategy": "nde", "draft": "rnn+retrieval"}, "strategy", "hidden states"),
    ({"draft": "rnn,retrieval", "dual": "merge", "strategy": "iid:2x2"}, "dual", "chain:L or topk"),
    ({"draft": "rnn,retrieval", "dual": "route", "strategy": "dynatree"}, "dual", "chain:L or topk"),
])
def test_settings_the_engine_refuses_are_refused_before_loading(kwargs: dict[str, Any], name: str,
                                                                message: str) -> None:
    with pytest.raises(SettingError) as caught:
        resolve_settings(**kwargs)
    assert caught.value.name == name and message in caught.value.message
    # the controls: the same settings with a draft that has hidden states, and with a chain strategy
    resolve_settings(strategy="nde", draft="distilled")
    resolve_settings(draft="rnn,retrieval", dual="merge", strategy="chain:3")


def test_nde_with_the_default_draft_is_one_line_before_torch() -> None:
    line = _one_error_line(_cli(["generate", "hi", "--strategy", "nde"]))
    assert "--strategy: 'nde' reads a draft model's hidden states" in line


def test_a_plain_run_reports_no_draft() -> None:
    for draft in (None, "rnn"):
        settings = resolve_settings(strategy="ar", draft=draft)
        assert settings.draft == "none" and settings.draft_models == (None,) and settings.as_dict()["draft"] == "none"
    assert resolve_settings().draft == "retrieval"  # the control: a speculative run keeps its draft


def test_stop_escapes_as_typed_in_a_shell() -> None:
    assert unescape(r"\n") == "\n" and unescape(r"a\tb\r") == "a\tb\r" and unescape(r"\\n") == "\\n"
    assert unescape(r"\x41\u00e9") == "Aé" and unescape("\\") == "\\" and unescape(r"\q\u12") == r"\q\u12"
    assert unescape("plain") == "plain"


def test_the_cli_hands_the_unescaped_stop_string_to_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def fake_load(settings: Any, notify: Any = None) -> tuple[Any, Any]:
        seen.append(settings.stop)
        raise SettingError("model", "stop here")

    monkeypatch.setattr(api, "load_decoder", fake_load)
    assert cli.main(["generate", "hi", "--stop", r"\n", "--stop", "END"]) == 2
    assert seen == [("\n", "END")]


def test_threads_beyond_the_cores_are_warned_about_once() -> None:
    cores = cpu_cores()
    assert thread_warning(cores) is None and thread_warning(1) is None
    warning = thread_warning(cores + 1)
    assert warning is not None and f"{cores + 1} threads on {cores} core" in warning
    before = torch.get_num_threads()
    notes: list[str] = []
    try:
        models.set_threads(cores + 1, notes.append)
        models.set_threads(cores + 1, notes.append)  # unchanged: said once
        assert torch.get_num_threads() == cores + 1 and len(notes) == 1 and "warning" in notes[0]
    finally:
        torch.set_num_threads(before)


def test_load_model_chooses_one_thread_like_the_cli_and_says_so(tiny_chat_model_dir: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(models, "_TORCH_DEFAULT_THREADS", 2)  # as if torch's own default were untouched
        notes: list[str] = []
        models.load_model(tiny_chat_model_dir, notify=notes.append)
        assert torch.get_num_threads() == 1 and any("1 torch thread" in n for n in notes), notes
        torch.set_num_threads(2)  # a thread count someone chose (not torch's default) is kept
        monkeypatch.setattr(models, "_TORCH_DEFAULT_THREADS", 3)
        models.load_model(tiny_chat_model_dir, notify=notes.append)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_writing_a_large_cache_entry_is_reported_with_its_size(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import spec_fast.cache

    def fake_save(entry: str, model: Any, tokenizer: Any) -> None:
        os.makedirs(entry)
        with open(os.path.join(entry, "model.safetensors"), "wb") as handle:
            handle.write(b"\0" * 3 * 2**20)

    monkeypatch.setattr(spec_fast.cache, "save_entry", fake_save)
    notes: list[str] = []
    monkeypatch.setattr(models, "LARGE_CACHE_BYTES", 2**20)
    models._save_entry_or_note(str(tmp_path / "entry"), None, None, notes.append)
    assert len(notes) == 1 and notes[0].startswith("wrote 3 MiB to ") and "delete it" in notes[0]
    monkeypatch.setattr(models, "LARGE_CACHE_BYTES", 2**30)  # control: a small entry is not worth a line
    models._save_entry_or_note(str(tmp_path / "small"), None, None, notes.append)
    assert len(notes) == 1


def test_the_live_rate_counts_decoding_only_like_the_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(err, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)

    def fake_load(settings: Any, notify: Any = None) -> tuple[Any, Any]:
        clock[0] += 100.0  # the model load
        return None, None

    def fake_complete(decoder: Any, tokenizer: Any, messages: Any, settings: Any, on_text: Any = None,
                      on_step: Any = None) -> Any:
        clock[0] += 2.0
        on_step(20, 10)  # 20 tokens in the 2 s of decoding
        metrics = types.SimpleNamespace(tokens_per_s=10.0, block_efficiency=2.0, strategy="chain:2")
        return types.SimpleNamespace(metrics=metrics, tokens=[0] * 20, finish_reason="length", text="x",
                                     settings=settings)

    monkeypatch.setattr(api, "load_decoder", fake_load)
    monkeypatch.setattr(api, "complete", fake_complete)
    assert cli.main(["generate", "hi", "--no-stream"]) == 0
    assert "20/128 tokens  10.0 tok/s" in err.getvalue() and "10.0 tok/s, block efficiency" in err.getvalue()


def test_version() -> None:
    proc = subprocess.run([sys.executable, "-m", "spec_fast", "--version"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"spec-fast {cli.package_version()}"
    assert proc.stdout.split()[1][0].isdigit()


def test_an_unreachable_hub_fails_in_seconds_not_a_minute() -> None:
    for env in ({"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}):
        start = time.monotonic()
        line = _one_error_line(_cli(["generate", "hi", "--model", "someorg/some-model-not-cached"], env=env))
        assert time.monotonic() - start < 30 and "cannot be reached" in line, line


def test_stdin_is_decoded_as_utf8_with_text_mode_newlines(monkeypatch: pytest.MonkeyPatch) -> None:
    stdin = io.TextIOWrapper(io.BytesIO("Grüße\r\nzwei\rdrei\n".encode()), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert cli._read_prompt("-") == "Grüße\nzwei\ndrei\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok \xc3("), encoding="utf-8"))
    with pytest.raises(SettingError, match=r"stdin is not valid UTF-8 text \(byte 0xc3 at byte 3\)"):
        cli._read_prompt("-")
