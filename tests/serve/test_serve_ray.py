"""``spec-fast serve --ray`` with a real Ray instance on 127.0.0.1 (the tiny test model, one torch thread per
replica): two replicas answer concurrent clients exactly as the single-process server does; a simulated
two-node cluster gets one replica per node; a replica killed mid-load loses no request silently (each one in
flight on it completes or fails with a retryable error, none hangs), Ray replaces it and later requests
succeed. Every wait is bounded; the Ray processes end with each test."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the ray extra"),
              pytest.mark.slow,
              # one Ray instance at a time on this machine: with pytest-xdist every test here runs on one worker
              pytest.mark.xdist_group("ray")]
pytest.importorskip("fastapi", reason="spec-fast serve needs the serve extra")
pytest.importorskip("openai")
import httpx  # noqa: E402
import openai  # noqa: E402

from spec_fast.serve.app import REPLICA_HEADER  # noqa: E402
from tests.serve.conftest import API_KEY, TINY_ARGS  # noqa: E402
from tests.serve.server import HOST, ROOT, ServerProcess  # noqa: E402
from tests.serve.test_serve_load import Job, load_jobs  # noqa: E402

#: Ray's start-up, then two replicas importing torch and loading the tiny model, on a busy 2-core machine
START_TIMEOUT_S = 240.0
#: SIGTERM to exit: the replicas' 5 s of grace, Serve's own rounds, Ray's shutdown
STOP_TIMEOUT_S = 90.0


def ray_server(model_dir: str, *ray_args: str) -> ServerProcess:
    """The same server as the ``tiny_server`` fixture (model, strategy, batch, queue, name, key), as replicas."""
    return ServerProcess(["--model", model_dir, *TINY_ARGS, "--max-batch", "4", "--max-queue", "32",
                          "--served-model-name", "tiny", "--shutdown-timeout", "5", "--ray", *ray_args],
                         api_key=API_KEY)


@contextmanager
def serving(server: ServerProcess) -> Iterator[ServerProcess]:
    """Start the command, wait until every replica runs (its 'serving on' line), stop it by SIGTERM after."""
    server.start(wait=False)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "spec-fast: serving on" not in server.output():
            assert server.proc is not None and server.proc.poll() is None, f"exited early:\n{server.output()}"
            assert time.monotonic() < deadline, f"not serving within {START_TIMEOUT_S} s:\n{server.output()}"
            time.sleep(0.2)
        yield server
        assert server.stop(signal.SIGTERM, timeout_s=STOP_TIMEOUT_S) == 0, server.output()
    finally:
        server.__exit__(None, None, None)  # kills it if the test failed before the SIGTERM


def replies_concurrently(server: ServerProcess, work: list[list[Job]]) -> list[list[tuple[str, str, int, str]]]:
    """One thread per client, each sending its jobs in turn; bounded."""
    results: list[list[tuple[str, str, int, str]]] = [[] for _ in work]
    threads = [threading.Thread(target=lambda c=c: results[c].extend(job.reply(server) for job in work[c]))
               for c in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not any(thread.is_alive() for thread in threads), "a client hung"
    return results


def test_two_replicas_answer_concurrent_clients_as_the_single_process_server(
        tiny_server: ServerProcess, tiny_serve_model_dir: str) -> None:
    jobs = load_jobs()
    alone = [job.reply(tiny_server) for job in jobs]
    with serving(ray_server(tiny_serve_model_dir, "--replicas", "2")) as server:
        # the same endpoints and the same error objects, through Ray Serve's proxy
        for method, path, body, headers in [
            ("GET", "/health", None, {}),
            ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2}, {}),  # no API key: 401
            ("POST", "/v1/completions", {"prompt": "a", "n": 2}, None),  # 400
            ("POST", "/v1/completions", {"prompt": "a", "model": "other"}, None),  # 404
            ("POST", "/v1/chat/completions", {"messages": []}, None),  # 400 or 422, as the single server says
        ]:
            got, want = (httpx.request(method, s.base_url + path, json=body, timeout=30,
                                       headers=s.headers() if headers is None else headers)
                         for s in (server, tiny_server))
            assert (got.status_code, got.json()) == (want.status_code, want.json()), path
        models = httpx.get(server.base_url + "/v1/models", headers=server.headers(), timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        assert "spec_fast:http_requests_total" in httpx.get(server.base_url + "/metrics", timeout=30).text

        # 8 clients x 3 requests at once: greedy and seeded sampled, chat and text, streams, stop strings;
        # the client notes which replica answered each (the header the Ray deployment adds)
        answered_by: list[str] = []
        server._client = openai.OpenAI(  # ServerProcess.client()'s client, with a hook on every response
            base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60.0,
            http_client=httpx.Client(event_hooks={"response": [
                lambda response: answered_by.append(response.headers.get(REPLICA_HEADER, ""))]}))
        work = [[jobs[(client * 5 + k * 7) % len(jobs)] for k in range(3)] for client in range(8)]
        results = replies_concurrently(server, work)
        for client, replies in enumerate(results):
            for job, got in zip(work[client], replies, strict=True):
                assert got[:3] == alone[jobs.index(job)][:3], (job, got)
        assert len({got[3] for replies in results for got in replies}) == 24  # nothing answered twice
        assert len(answered_by) == 24 and "" not in answered_by and len(set(answered_by)) == 2, answered_by


def test_a_model_that_fails_to_load_ends_the_command_with_one_line_and_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    server = ServerProcess(["--model", str(empty), "--draft", "none", "--ray", "--ray-start-timeout", "180"])
    server.start(wait=False)
    try:
        assert server.proc is not None and server.proc.wait(START_TIMEOUT_S) == 2
        errors = [line for line in server.output().splitlines() if line.startswith("spec-fast: error:")]
    finally:
        server.__exit__(None, None, None)
    # the replica's own error line, found in Ray's status message (which carries its traceback)
    assert len(errors) == 1, errors
    assert errors[0].startswith("spec-fast: error: the replicas failed to start: the model failed to load: ")


# ---------------------------------------------------------------------------------- a two-node cluster
@pytest.fixture
def two_node_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Two Ray nodes of one CPU each on this machine, both on 127.0.0.1 (``ray.cluster_utils.Cluster``)."""
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # the nodes' workers import this checkout's spec_fast, as the command does
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Ray's single-machine mode: it resolves "this node's address" to the loopback address, not the one
    # that routes outwards, so that nothing here listens on or talks to any other address (the variable for
    # the processes started from here, the constant for this one, if Ray was imported before)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    # the Serve controller runs on this cluster and reads these from its processes' environment: the command
    # sets them only for the instances it starts itself (a busy 2-core machine misses Serve's 5 s default)
    for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
        monkeypatch.setenv(name, "30")
    node = {"num_cpus": 1, "node_ip_address": HOST, "object_store_memory": 80 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        assert cluster.address.startswith(HOST + ":"), cluster.address
        yield cluster
    finally:
        cluster.shutdown()


def test_without_an_address_the_command_starts_its_own_instance_beside_a_running_one(
        two_node_cluster: Any, tmp_path: Path) -> None:
    """A Ray instance already running on the machine (another user's, or another test's) is not joined: the
    command starts its own, so that its usual one-line error still ends a failed start (``ray.init`` with
    ``num_cpus`` used to try to join the running instance and die with a traceback, exit 1)."""
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    server = ServerProcess(["--model", str(empty), "--draft", "none", "--ray", "--ray-start-timeout", "180"])
    server.start(wait=False)
    try:
        assert server.proc is not None and server.proc.wait(START_TIMEOUT_S) == 2, server.output()[-2000:]
        errors = [line for line in server.output().splitlines() if line.startswith("spec-fast: error:")]
    finally:
        server.__exit__(None, None, None)
    assert len(errors) == 1 and "the model failed to load" in errors[0], errors


def alive_replicas(cluster: Any) -> dict[str, tuple[int, str]]:
    """``{actor name: (pid, node id)}`` of the live replicas, from Ray's actor table."""
    table = cluster.global_state.actor_table(None)
    return {actor["Name"]: (int(actor["Pid"]), str(actor["Address"]["NodeID"])) for actor in table.values()
            if str(actor.get("Name", "")).startswith("SERVE_REPLICA::spec-fast#") and actor["State"] == "ALIVE"}


def retryable(err: BaseException) -> bool:
    """What a client retries on (the openai client's own rule): a connection that broke, or a status >= 500.
    A timeout is not: it means the request hung."""
    if isinstance(err, (openai.APITimeoutError, httpx.TimeoutException)):
        return False
    if isinstance(err, openai.APIStatusError):
        return err.status_code >= 500
    return isinstance(err, (openai.APIConnectionError, httpx.TransportError))


def test_one_replica_per_node_and_a_killed_replica_loses_no_request(
        two_node_cluster: Any, tiny_server: ServerProcess, tiny_serve_model_dir: str) -> None:
    cluster = two_node_cluster
    with serving(ray_server(tiny_serve_model_dir, "--ray-address", cluster.address, "--replicas", "2")) as server:
        replicas = alive_replicas(cluster)
        assert len(replicas) == 2 and len({node for _, node in replicas.values()}) == 2, replicas

        # 8 long greedy streams at once (900 tokens take the tiny model seconds), then one replica is killed
        # while every one of them is receiving tokens
        jobs = [Job("text" if i % 2 else "chat", f"story {i}", 900, stream=True) for i in range(8)]
        outcomes: list[tuple[str, Any] | None] = [None] * len(jobs)
        streaming = threading.Semaphore(0)

        def client(i: int) -> None:
            job = jobs[i]
            first = True
            try:
                args: dict[str, Any] = {"model": "tiny", "max_tokens": job.max_tokens, "stream": True,
                                        "temperature": 0.0}
                if job.endpoint == "chat":
                    stream = server.client().chat.completions.create(
                        messages=[{"role": "user", "content": job.prompt}], **args)
                else:
                    stream = server.client().completions.create(prompt=job.prompt, **args)
                pieces, finish = [], ""
                with stream:  # closes the connection whatever happens
                    for chunk in stream:
                        if first:
                            first = False
                            streaming.release()
                        for choice in chunk.choices:
                            pieces.append((choice.delta.content or "") if job.endpoint == "chat" else choice.text)
                            finish = choice.finish_reason or finish
                outcomes[i] = ("ok", ("".join(pieces), finish))
            except Exception as err:  # classified below
                outcomes[i] = ("error", err)
            finally:
                if first:
                    streaming.release()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
        for thread in threads:
            thread.start()
        for _ in jobs:  # every request is on a replica, receiving tokens (or the test is already failing)
            assert streaming.acquire(timeout=60)
        victim, (pid, node) = next(iter(replicas.items()))
        assert "ServeReplica" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")  # ours, a replica
        os.kill(pid, signal.SIGKILL)
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a request hung after the replica died"

        assert all(outcome is not None for outcome in outcomes)
        failed = [outcome[1] for outcome in outcomes if outcome and outcome[0] == "error"]
        print(f"\nkilled a replica under load: {len(failed)} of {len(jobs)} requests failed: "
              f"{sorted({type(err).__name__ for err in failed})}")
        assert all(retryable(err) for err in failed), [repr(err) for err in failed]
        assert failed, "no request was in flight on the killed replica: the test did not test the failure"
        # the requests on the other replica completed, whole and right
        done = [i for i, outcome in enumerate(outcomes) if outcome and outcome[0] == "ok"]
        alone = replies_concurrently(tiny_server, [[jobs[i]] for i in done])
        assert [outcomes[i][1] for i in done] == [got[0][:2] for got in alone]  # type: ignore[index]

        # Ray replaces the replica (on the node whose CPU it freed) and the next requests succeed
        deadline = time.monotonic() + 120
        while True:
            now = alive_replicas(cluster)
            if len(now) == 2 and victim not in now:
                break
            assert time.monotonic() < deadline, f"the replica was not replaced within 120 s: {now}"
            time.sleep(0.5)
        assert node in {n for _, n in now.values()} and len({n for _, n in now.values()}) == 2
        later = load_jobs()[:6]
        expected = [job.reply(tiny_server)[:3] for job in later]
        assert [got[0][:3] for got in replies_concurrently(server, [[job] for job in later])] == expected
