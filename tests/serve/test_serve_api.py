"""The OpenAI-compatible API of ``spec-fast serve`` through the official ``openai`` client (and raw HTTP for
what the client cannot send), against a real server process on 127.0.0.1 running the tiny test model."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="spec-fast serve needs the serve extra")
openai = pytest.importorskip("openai")
import httpx  # noqa: E402

from tests.serve.conftest import CONTEXT  # noqa: E402
from tests.serve.server import ServerProcess  # noqa: E402

HELLO = [{"role": "user", "content": "hello"}]
#: the tiny model's chat template applied to HELLO; its tokenizer has one token per character
HELLO_TEMPLATE = "<user>hello\n<assistant>"


def chat(server: ServerProcess, **kwargs: Any) -> Any:
    args: dict[str, Any] = {"model": "tiny", "messages": HELLO, "max_tokens": 24, "temperature": 0}
    args.update(kwargs)
    return server.client().chat.completions.create(**args)


def streamed_chat(server: ServerProcess, **kwargs: Any) -> tuple[str, list[Any]]:
    chunks = list(chat(server, stream=True, **kwargs))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def test_health_answers_503_while_the_model_loads_then_200(tiny_server: ServerProcess) -> None:
    statuses = tiny_server.health_statuses
    assert statuses[-1] == 200
    # the engine thread imports torch and loads the model after the server listens: seconds of 503
    assert 503 in statuses, statuses
    assert set(statuses) <= {0, 503, 200}


def test_models_lists_the_served_model(tiny_server: ServerProcess) -> None:
    models = tiny_server.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].model_extra["max_model_len"] == CONTEXT


def test_chat_reply_usage_and_speculative_statistics(tiny_server: ServerProcess) -> None:
    reply = chat(tiny_server, max_tokens=24)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == "tiny" and reply.id.startswith("chatcmpl-")
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert len(choice.message.content) == 24  # one character per token, no special token in the text
    assert reply.usage.prompt_tokens == len(HELLO_TEMPLATE)
    assert reply.usage.completion_tokens == 24 and reply.usage.total_tokens == len(HELLO_TEMPLATE) + 24
    spec = choice.model_extra["speculative_decoding"]
    assert spec["strategy"] == "chain:3/greedy" and spec["draft"] == "early-exit:2"
    # each verification pass emits its accepted draft tokens plus one: 24 tokens took 24 / (1 + mean) passes
    assert 1 <= spec["target_passes"] <= 24
    assert sum(spec["accepted_length_histogram"]) == spec["target_passes"]
    assert spec["target_passes"] + spec["accepted_tokens"] == 24
    assert spec["accepted_tokens"] == sum(spec["accepted_per_position"])


def test_streamed_chat_equals_the_whole_reply_and_ends_with_usage(tiny_server: ServerProcess) -> None:
    whole = chat(tiny_server, max_tokens=30)
    text, chunks = streamed_chat(tiny_server, max_tokens=30, stream_options={"include_usage": True})
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    usage = chunks[-1].usage.model_dump()
    # the same prompt again: its entries but the last token's come from the prefix cache
    assert usage.pop("prompt_tokens_details")["cached_tokens"] == len(HELLO_TEMPLATE) - 1
    assert chunks[-1].choices == [] and usage == {k: v for k, v in whole.usage.model_dump().items()
                                                  if k != "prompt_tokens_details"}
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1
    # without include_usage no chunk carries usage
    _, plain = streamed_chat(tiny_server, max_tokens=5)
    assert all(c.choices and c.usage is None for c in plain)


def test_raw_stream_is_server_sent_events_ending_in_done(tiny_server: ServerProcess) -> None:
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", tiny_server.base_url + "/v1/completions", json=body, headers=tiny_server.headers(),
                      timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    assert all(p["object"] == "text_completion" for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"


def test_completions_of_text_and_of_its_token_ids_agree(tiny_server: ServerProcess) -> None:
    client = tiny_server.client()
    by_text = client.completions.create(model="tiny", prompt="hello", max_tokens=20, temperature=0)
    ids = [ord(c) - 29 for c in "hello"]  # the tiny vocabulary: three special tokens, then chr(32)...
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=20, temperature=0)
    other = client.completions.create(model="tiny", prompt=[i + 1 for i in ids], max_tokens=20, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.usage.prompt_tokens == 5 and by_text.usage.completion_tokens == 20
    assert other.choices[0].text != by_text.choices[0].text  # negative control: the ids are what is decoded
    assert by_text.object == "text_completion" and by_text.id.startswith("cmpl-")


def test_stop_strings_cut_the_reply_before_the_first_match(tiny_server: ServerProcess) -> None:
    full = chat(tiny_server, max_tokens=40).choices[0].message.content
    stop = full[12:14]
    cut = full[: full.find(stop)]
    assert len(cut) <= 12 and stop in full  # the control: without the stop string the reply goes on
    for stops in (stop, [stop, "\u2603"]):
        reply = chat(tiny_server, max_tokens=40, stop=stops)
        assert reply.choices[0].message.content == cut and reply.choices[0].finish_reason == "stop"
        assert reply.usage.completion_tokens < 40
        text, chunks = streamed_chat(tiny_server, max_tokens=40, stop=stops)
        assert text == cut and chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats_and_another_seed_differs(tiny_server: ServerProcess) -> None:
    def sampled(seed: int) -> str:
        return str(chat(tiny_server, max_tokens=30, temperature=1.0, top_p=0.95, seed=seed)
                   .choices[0].message.content)

    first = sampled(5)
    sampled_spec = chat(tiny_server, max_tokens=2, temperature=1.0, seed=5).choices[0].model_extra
    assert sampled_spec["speculative_decoding"]["strategy"] == "chain:3/naive"  # the verifier that ran
    assert sampled(5) == first
    assert sampled(6) != first  # 30 draws from a random model: equal only by a vanishing chance
    greedy = chat(tiny_server, max_tokens=30).choices[0].message.content
    assert first != greedy
    # top_k (an extra field) at 1 is greedy whatever the seed and temperature
    top1 = chat(tiny_server, max_tokens=30, temperature=1.0, seed=9, extra_body={"top_k": 1})
    assert top1.choices[0].message.content == greedy


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert "Traceback" not in response.text
    return dict(body["error"])


def post(server: ServerProcess, path: str, headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
    return httpx.post(server.base_url + path, headers=server.headers() if headers is None else headers,
                      timeout=60, **kwargs)


def test_api_key_is_required_on_v1_routes(tiny_server: ServerProcess) -> None:
    bad_client = openai.OpenAI(base_url=tiny_server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad_client.models.list()
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    missing = post(tiny_server, "/v1/chat/completions", headers={}, json={"model": "tiny", "messages": HELLO})
    assert missing.status_code == 401 and error_of(missing)["type"] == "authentication_error"
    # the probes stay open (load balancers and Prometheus carry no key)
    assert httpx.get(tiny_server.base_url + "/health").status_code == 200
    assert httpx.get(tiny_server.base_url + "/metrics").status_code == 200


@pytest.mark.parametrize("change, status, param, code", [
    ({"n": 2}, 400, "n", "unsupported_value"),
    ({"logprobs": True}, 400, "logprobs", "unsupported_value"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty", "unsupported_value"),
    ({"max_tokens": CONTEXT}, 400, "max_tokens", "context_length_exceeded"),
    ({"model": "gpt-4o"}, 404, "model", "model_not_found"),
    ({"temperature": -1}, 422, "temperature", "invalid_value"),
    ({"top_p": 0}, 422, "top_p", "invalid_value"),
    ({"max_tokens": 0}, 422, "max_tokens", "invalid_value"),
    ({"seed": -3}, 422, "seed", "invalid_value"),
    ({"stop": [""]}, 400, "stop", "invalid_value"),
    ({"messages": []}, 422, "messages", "invalid_value"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 422, "messages.0.role", "invalid_value"),
    ({"messages": [{"role": "system", "content": "only a system message"}]}, 400, "messages", "invalid_value"),
])
def test_bad_chat_requests_get_openai_errors(tiny_server: ServerProcess, change: dict[str, Any], status: int,
                                            param: str, code: str) -> None:
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 4, **change}
    response = post(tiny_server, "/v1/chat/completions", json=body)
    assert response.status_code == status, response.text
    error = error_of(response)
    assert (error["param"], error["code"]) == (param, code), error


def test_the_openai_client_raises_the_matching_exceptions(tiny_server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        chat(tiny_server, n=2)
    with pytest.raises(openai.NotFoundError):
        chat(tiny_server, model="nope")
    with pytest.raises(openai.UnprocessableEntityError):
        chat(tiny_server, temperature=5)


def test_prompts_longer_than_the_context_are_refused_not_truncated(tiny_server: ServerProcess) -> None:
    long_prompt = "a" * CONTEXT
    for path, body in (("/v1/completions", {"prompt": long_prompt}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": long_prompt}]})):
        response = post(tiny_server, path, json={"model": "tiny", **body})
        assert response.status_code == 400 and error_of(response)["code"] == "context_length_exceeded"
    # the control: one token less than the context fits (with the one token it leaves)
    fits = post(tiny_server, "/v1/completions", json={"model": "tiny", "prompt": "a" * (CONTEXT - 1), "temperature": 0})
    assert fits.status_code == 200 and fits.json()["usage"]["completion_tokens"] == 1


def test_malformed_oversized_and_misrouted_requests(tiny_server: ServerProcess) -> None:
    not_json = post(tiny_server, "/v1/chat/completions", content=b"{nope",
                    headers={**tiny_server.headers(), "content-type": "application/json"})
    assert not_json.status_code == 400 and error_of(not_json)["code"] == "invalid_json"
    too_large = post(tiny_server, "/v1/completions", content=b"x" * (4 * 2**20 + 1),
                     headers={**tiny_server.headers(), "content-type": "application/json"})
    assert too_large.status_code == 413 and error_of(too_large)["code"] == "request_too_large"
    missing = post(tiny_server, "/v1/completions", json={"model": "tiny"})
    assert missing.status_code == 422 and error_of(missing)["param"] == "prompt"
    several = post(tiny_server, "/v1/completions", json={"model": "tiny", "prompt": ["a", "b"]})
    assert several.status_code == 400 and error_of(several)["param"] == "prompt"
    unknown = httpx.get(tiny_server.base_url + "/v1/engines", headers=tiny_server.headers())
    assert unknown.status_code == 404 and error_of(unknown)["code"] == "not_found"
    wrong_method = httpx.get(tiny_server.base_url + "/v1/chat/completions", headers=tiny_server.headers())
    assert wrong_method.status_code == 405 and error_of(wrong_method)["code"] == "method_not_allowed"


def test_metrics_count_requests_and_speculative_decoding(tiny_server: ServerProcess) -> None:
    chat(tiny_server, max_tokens=16)
    chat(tiny_server, max_tokens=16)  # the same prompt: a prefix cache hit
    text = httpx.get(tiny_server.base_url + "/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values['spec_fast:request_success_total{finished_reason="length"}'] >= 1
    assert values['spec_fast:http_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 1
    assert values["spec_fast:generation_tokens_total"] >= 16
    assert values["spec_fast:time_to_first_token_seconds_count"] >= 1
    assert values["spec_fast:time_per_output_token_seconds_count"] >= 1
    assert values["spec_fast:spec_decode_num_drafts_total"] >= 1
    assert values["spec_fast:spec_decode_num_draft_tokens_total"] >= values["spec_fast:spec_decode_num_accepted_tokens_total"]
    assert 'spec_fast:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in values
    assert "spec_fast:num_requests_running" in values and "spec_fast:num_requests_waiting" in values
    assert values["spec_fast:prefix_cache_hit_tokens_total"] >= len(HELLO_TEMPLATE) - 1
