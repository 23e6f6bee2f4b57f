"""``GET /metrics``: Prometheus metrics named after vLLM's (``vllm:`` becomes ``spec_fast:``), so that the
dashboards and alerts people already have for vLLM read ours with a changed prefix.

Each server holds its own registry (two apps in one process, as in the tests, do not collide). Request
latencies are measured by the HTTP side from the moment a request arrives; the gauges are set by the engine
thread after every step; the speculative-decoding counters are added once per request when it ends
(finished or aborted), from the engine's per-request statistics.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

__all__ = ["ServeMetrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# without the ``*_created`` timestamp series the client adds to every counter (vLLM's output has none)
disable_created_metrics()  # type: ignore[no-untyped-call]

_PREFIX = "spec_fast:"
# vLLM's buckets for the time to first token and per output token (seconds)
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
#: accepted-token positions get one label each up to here; deeper ones are counted at this position
MAX_POSITION_LABEL = 32


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(_PREFIX + "http_requests", "HTTP requests by endpoint and status code",
                                     ["endpoint", "status"], registry=r)
        self.request_success = Counter(_PREFIX + "request_success", "Finished generation requests by reason",
                                       ["finished_reason"], registry=r)
        self.prompt_tokens = Counter(_PREFIX + "prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.cached_prompt_tokens = Counter(_PREFIX + "prefix_cache_hit_tokens",
                                            "Prompt tokens whose cache entries were reused from an earlier prompt",
                                            registry=r)
        self.generation_tokens = Counter(_PREFIX + "generation_tokens", "Generated tokens", registry=r)
        self.running = Gauge(_PREFIX + "num_requests_running", "Requests in the running batch", registry=r)
        self.waiting = Gauge(_PREFIX + "num_requests_waiting", "Requests waiting for a batch slot", registry=r)
        self.ttft = Histogram(_PREFIX + "time_to_first_token_seconds", "Arrival to first generated token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(_PREFIX + "time_per_output_token_seconds",
                              "Mean time per generated token after the first, per request", buckets=_TPOT_BUCKETS,
                              registry=r)
        self.e2e = Histogram(_PREFIX + "e2e_request_latency_seconds", "Arrival to the last token",
                             buckets=_E2E_BUCKETS, registry=r)
        self.num_drafts = Counter(_PREFIX + "spec_decode_num_drafts", "Verification passes of requests that drafted",
                                  registry=r)
        self.num_draft_tokens = Counter(_PREFIX + "spec_decode_num_draft_tokens", "Draft tokens proposed",
                                        registry=r)
        self.num_accepted_tokens = Counter(_PREFIX + "spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                           registry=r)
        self.accepted_per_position = Counter(_PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted at each depth (0 = the first draft token)",
                                             ["position"], registry=r)

    def observe_http(self, endpoint: str, status: int) -> None:
        self.http_requests.labels(endpoint=endpoint, status=str(status)).inc()

    def set_batch(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def observe_admitted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)

    def observe_finished(self, reason: str, stats: Any, arrival_s: float, first_token_s: float | None,
                         end_s: float, generated_tokens: int) -> None:
        """One ended request: its reason, latencies (``time.monotonic`` values) and the engine's statistics."""
        self.request_success.labels(finished_reason=reason).inc()
        self.generation_tokens.inc(generated_tokens)
        if first_token_s is not None:
            self.ttft.observe(first_token_s - arrival_s)
            if generated_tokens > 1:
                self.tpot.observe((end_s - first_token_s) / (generated_tokens - 1))
        self.e2e.observe(end_s - arrival_s)
        if stats is None:
            return
        self.cached_prompt_tokens.inc(int(getattr(stats, "cached_prompt_tokens", 0)))
        draft_tokens = int(getattr(stats, "draft_tokens", 0))
        if draft_tokens:
            # the request's verification passes; with +adaptive some of them were plain steps that checked
            # no draft (the engine counts passes per request, not drafting passes)
            self.num_drafts.inc(int(getattr(stats, "target_passes", 0)))
            self.num_draft_tokens.inc(draft_tokens)
        self.num_accepted_tokens.inc(int(getattr(stats, "accepted_tokens", 0)))
        for position, count in enumerate(getattr(stats, "accepted_per_position", [])):
            if count:
                label = str(min(position, MAX_POSITION_LABEL))
                self.accepted_per_position.labels(position=label).inc(int(count))

    def render(self) -> bytes:
        return generate_latest(self.registry)
