"""``spec-fast serve`` under load and faults, on the tiny test model: concurrent clients get exactly the
replies they get alone; clients that vanish mid-stream free their slots at once; the process's memory stays
flat over hundreds of requests; a full queue answers 429 at once; SIGTERM ends the process cleanly."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="spec-fast serve needs the serve extra")
pytest.importorskip("openai")
import httpx  # noqa: E402

from tests.serve.conftest import TINY_ARGS  # noqa: E402
from tests.serve.server import ServerProcess  # noqa: E402


@dataclass(frozen=True)
class Job:
    """One request of the load test; ``reply(server)`` is what the client saw: (text, finish, usage)."""

    endpoint: str
    prompt: str
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False

    def reply(self, server: ServerProcess) -> tuple[str, str, int, str]:
        client = server.client()
        args: dict[str, Any] = {"model": "tiny", "max_tokens": self.max_tokens, "temperature": self.temperature,
                                "stream": self.stream}
        if self.seed is not None:
            args["seed"] = self.seed
        if self.stop:
            args["stop"] = list(self.stop)
        if self.endpoint == "chat":
            result = client.chat.completions.create(messages=[{"role": "user", "content": self.prompt}], **args)
        else:
            result = client.completions.create(prompt=self.prompt, **args)
        if not self.stream:
            choice = result.choices[0]
            text = choice.message.content if self.endpoint == "chat" else choice.text
            return text, choice.finish_reason, result.usage.completion_tokens, result.id
        pieces, finish, ids = [], "", set()
        for chunk in result:
            ids.add(chunk.id)
            for choice in chunk.choices:
                pieces.append((choice.delta.content or "") if self.endpoint == "chat" else choice.text)
                finish = choice.finish_reason or finish
        assert len(ids) == 1, ids  # one response's chunks all carry its id
        return "".join(pieces), finish, -1, ids.pop()


def load_jobs() -> list[Job]:
    """12 different requests: greedy and seeded sampled, chat and text, stop strings, lengths, streams."""
    prompts = ["hello", "tell me a story", "abc", "The quick brown fox", "x", "12345"]
    jobs = []
    for i in range(12):
        jobs.append(Job(
            endpoint="chat" if i % 2 == 0 else "text", prompt=prompts[i % len(prompts)] + " " * (i // 6),
            max_tokens=(8, 17, 33, 50)[i % 4], temperature=0.0 if i % 3 else 0.9, seed=100 + i if i % 3 == 0 else None,
            stop=("e", "q") if i % 5 == 1 else (), stream=i % 4 in (1, 2),
        ))
    return jobs


def test_concurrent_replies_equal_the_same_requests_served_alone(tiny_server: ServerProcess) -> None:
    jobs = load_jobs()
    alone = [job.reply(tiny_server) for job in jobs]
    assert len({text for text, *_ in alone}) == len(jobs)  # the control: every job's reply is its own
    # 16 clients x 3 requests, each client a different mix, all at once
    work = [[jobs[(client * 5 + k * 7) % len(jobs)] for k in range(3)] for client in range(16)]
    results: list[list[tuple[str, str, int, str]]] = [[] for _ in work]

    def run(client: int) -> None:
        for job in work[client]:
            results[client].append(job.reply(tiny_server))

    running: list[float] = []
    done = threading.Event()

    def watch() -> None:  # the running batch size while the clients run
        while not done.is_set():
            running.append(metric(tiny_server, "spec_fast:num_requests_running"))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(run, range(16), timeout=240))
    finally:
        done.set()
        watcher.join(30)
    # the control: the requests really were decoded together (a server taking one at a time passes the rest)
    assert max(running) >= 2, running
    ids = []
    for client, replies in enumerate(results):
        assert len(replies) == 3
        for job, got in zip(work[client], replies):
            expected = alone[jobs.index(job)]
            assert got[:3] == expected[:3], (job, got, expected)
            ids.append(got[3])
    assert len(set(ids)) == 48  # nothing answered twice
    assert httpx.get(tiny_server.base_url + "/health").status_code == 200


def metric(server: ServerProcess, name: str) -> float:
    for line in httpx.get(server.base_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split(" ")[1])
    return 0.0


def wait_for(condition: Any, timeout_s: float) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout_s``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - start


def open_stream(server: ServerProcess, max_tokens: int, first_event: bool = True) -> tuple[httpx.Client, Any, Any]:
    """A streaming completion, admitted (its headers have arrived), with its first event read if
    ``first_event``; (client, response context, lines)."""
    client = httpx.Client(timeout=60)
    context = client.stream("POST", server.base_url + "/v1/completions", headers=server.headers(), json={
        "model": "tiny", "prompt": "abc", "max_tokens": max_tokens, "temperature": 0, "stream": True})
    response = context.__enter__()
    assert response.status_code == 200
    lines = response.iter_lines()
    if first_event:
        assert next(line for line in lines if line).startswith("data: {")
    return client, context, lines


def test_clients_that_disconnect_mid_stream_are_aborted_while_others_continue(tiny_server: ServerProcess) -> None:
    reference = Job("text", "hello", 60, stream=True).reply(tiny_server)
    aborted_before = metric(tiny_server, 'spec_fast:request_success_total{finished_reason="abort"}')
    # two clients start replies that would take thousands of steps, then vanish
    leaving = [open_stream(tiny_server, 900) for _ in range(2)]
    staying: list[tuple[str, str, int, str]] = []
    worker = threading.Thread(target=lambda: staying.extend(
        Job("text", "hello", 60, stream=True).reply(tiny_server) for _ in range(3)))
    worker.start()
    for client, context, _ in leaving:
        context.__exit__(None, None, None)
        client.close()
    # both are aborted within a step or two of the disconnect: their 900 tokens would take far longer
    waited = wait_for(lambda: metric(tiny_server, 'spec_fast:request_success_total{finished_reason="abort"}')
                      >= aborted_before + 2, timeout_s=10)
    worker.join(120)
    assert not worker.is_alive() and [got[:3] for got in staying] == [reference[:3]] * 3
    wait_for(lambda: metric(tiny_server, "spec_fast:num_requests_running") == 0, timeout_s=10)
    assert waited < 5
    # a client waiting for a whole (not streamed) reply that gives up is aborted too
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(tiny_server.base_url + "/v1/completions", headers=tiny_server.headers(), timeout=0.5, json={
            "model": "tiny", "prompt": "abc", "max_tokens": 900, "temperature": 0})
    waited = wait_for(lambda: metric(tiny_server, 'spec_fast:request_success_total{finished_reason="abort"}')
                      >= aborted_before + 3, timeout_s=10)
    assert waited < 5
    assert httpx.get(tiny_server.base_url + "/health").status_code == 200


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_memory_stays_flat_over_hundreds_of_requests(tiny_server: ServerProcess) -> None:
    assert tiny_server.proc is not None
    jobs = [Job("chat" if i % 2 else "text", f"prompt {i}", 4, stream=i % 3 == 0) for i in range(40)]

    def burst(rounds: int) -> None:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda job: job.reply(tiny_server), jobs * rounds, timeout=300))

    burst(2)  # warm-up: allocator pools, tokenizer caches, first-use imports
    before = rss_bytes(tiny_server.proc.pid)
    burst(6)  # 240 requests
    grown = rss_bytes(tiny_server.proc.pid) - before
    # a leak of even 64 KiB per request (a kept KV cache is far larger) would grow it by 15 MiB
    assert grown < 12 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 240 requests"


def test_a_full_queue_answers_429_at_once_and_sigterm_exits_cleanly(tiny_serve_model_dir: str) -> None:
    with ServerProcess(["--model", tiny_serve_model_dir, *TINY_ARGS, "--max-batch", "1", "--max-queue", "1",
                        "--shutdown-timeout", "1", "--served-model-name", "tiny"]) as server:
        # one decoding, one waiting (admitted: its headers came, its first token waits for the first's end)
        busy = [open_stream(server, 1020), open_stream(server, 1020, first_event=False)]
        start = time.monotonic()
        refused = httpx.post(server.base_url + "/v1/completions", timeout=30, json={
            "model": "tiny", "prompt": "abc", "max_tokens": 4})
        assert refused.status_code == 429 and time.monotonic() - start < 2.0
        assert refused.json()["error"]["code"] == "queue_full" and refused.headers["retry-after"]
        # SIGTERM with two requests in flight (1020 tokens take seconds, longer than the 1 s they get): the listener
        # closes, both get the shutdown timeout, then end with an error event, and the process exits 0
        start = time.monotonic()
        assert server.stop(signal.SIGTERM, timeout_s=20) == 0, server.output()
        assert time.monotonic() - start < 1 + 8
        for client, context, lines in busy:
            events = [line for line in lines if line]
            assert events[-1] == "data: [DONE]"
            assert json.loads(events[-2][6:])["error"]["code"] == "engine_unavailable", events[-2]
            context.__exit__(None, None, None)
            client.close()
        assert "Traceback" not in server.output()
        # diagnostics (start-up lines, the access log) go to stderr; stdout stays empty
        assert '"POST /v1/completions HTTP/1.1" 429' in server.output() and server.stdout_text() == ""
