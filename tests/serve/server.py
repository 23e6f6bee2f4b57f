"""A real ``spec-fast serve`` process on 127.0.0.1 for the tests: a free port, a bounded start-up wait, and a
stop by SIGTERM whose exit status the tests can check. Nothing here talks to any other address."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
#: The tiny test model loads in a few seconds; the 2-core CI machine may be busy, hence the margin
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``python -m spec_fast serve ARGS --host 127.0.0.1 --port <free>``; ``with`` waits for /health 200 and
    stops the server at the end (SIGTERM, then SIGKILL if it does not exit in time)."""

    def __init__(self, args: list[str], api_key: str | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self.api_key = api_key
        self.args = [*args, "--host", HOST, "--port", str(self.port), "--threads", "1"]
        if api_key is not None:
            self.args += ["--api-key", api_key]
        self.log = tempfile.NamedTemporaryFile(prefix="spec-fast-serve-", suffix=".log", delete=False)  # stderr
        self.stdout = tempfile.TemporaryFile()
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        self._client: Any = None
        #: the /health statuses seen while starting (0: not listening yet, 503: loading, then 200)
        self.health_statuses: list[int] = []

    def start(self, wait: bool = True) -> ServerProcess:
        self.proc = subprocess.Popen([sys.executable, "-m", "spec_fast", "serve", *self.args], cwd=ROOT,
                                     stdout=self.stdout, stderr=self.log, env=dict(os.environ))
        if wait:
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> list[int]:
        """Poll /health until 200; the statuses seen (503 while the model loads)."""
        assert self.proc is not None
        seen: list[int] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode} before it was healthy:\n"
                                     f"{self.output()}")
            try:
                status = httpx.get(self.base_url + "/health", timeout=2.0).status_code
            except httpx.TransportError:
                status = 0  # not listening yet
            seen.append(status)
            if status == 200:
                self.health_statuses = seen
                return seen
            time.sleep(0.05)
        raise AssertionError(f"the server was not healthy within {timeout_s} s:\n{self.output()}")

    def client(self) -> Any:
        """An ``openai.OpenAI`` client of this server (one, shared: it is thread-safe), without retries."""
        if self._client is None:
            import openai

            self._client = openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key or "unused",
                                         max_retries=0, timeout=60.0)
        return self._client

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"the server did not exit within {timeout_s} s of signal {sig}") from None
        self.exit_code = self.proc.returncode
        return self.exit_code

    def output(self) -> str:
        """What the server wrote on stderr so far (start-up lines, the access log, errors)."""
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stdout_text(self) -> str:
        self.stdout.seek(0)
        return self.stdout.read().decode(errors="replace")

    def __enter__(self) -> ServerProcess:
        if self.proc is None:
            try:
                self.start()
            except BaseException:
                self.__exit__(None, None, None)
                raise
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if self._client is not None:
                self._client.close()
            if self.proc is not None and self.proc.poll() is None:
                self.stop()
        finally:
            self.log.close()
            self.stdout.close()
            os.unlink(self.log.name)
