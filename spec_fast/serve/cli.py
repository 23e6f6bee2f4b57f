"""``spec-fast serve`` (also ``python -m spec_fast serve``): the OpenAI-compatible HTTP server.

The model, draft and decoding flags are ``generate``'s own argparse actions (shared, not copied), so both
commands accept and check them alike; every flag is checked before FastAPI, torch or the model is imported,
and a mistake is one line on stderr with exit status 2. The model loads on the engine thread after the
server is listening (``/health`` answers 503 meanwhile); a model that fails to load stops the server with
one line and exit status 2, as ``generate`` does. SIGTERM (and Ctrl-C) stop accepting connections, let the
requests in flight finish for ``--shutdown-timeout`` seconds, abort the rest and exit 0 (130 for Ctrl-C).
The access log and start-up lines go to stderr.
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import sys
from typing import Any

from spec_fast.serve.ray_cli import add_ray_flags, check_ray_flags, serve_ray
from spec_fast.settings import GenerateSettings, SettingError, resolve_settings
from spec_fast.strategies import DEFAULT_STRATEGY

__all__ = ["add_serve_parser", "serve", "SHARED_FLAGS", "DEFAULT_MODEL_NAME"]

#: generate's flags that serve shares (their dests); sampling flags are per request in the HTTP API
SHARED_FLAGS = ("model", "gguf_file", "draft", "dual", "strategy", "verifier", "device", "dtype", "quantize",
                "lean", "kv_cache_dtype", "threads", "quiet")
#: the id of the default model in ``/v1/models`` (and the ``model`` clients send)
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_API_KEY_ENV = "SPEC_FAST_API_KEY"
#: spec_fast.engine.batch_engine.DEPTH_POLICIES, kept here so that parsing imports no torch (a test keeps them equal)
DEPTH_POLICIES = ("cost", "fixed")


def add_serve_parser(subparsers: Any, generate: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``serve`` to ``subparsers``, sharing :data:`SHARED_FLAGS` with the ``generate`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="serve the model over an OpenAI-compatible HTTP API",
        description="Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, "
                    "/v1/models, /health, /metrics) with speculative decoding and continuous batching. "
                    "Sampling settings (temperature, top_p, top_k, seed, stop, max_tokens) come with each "
                    "request. Needs the serve extra (pip install 'spec-verify[serve]').",
    )
    for action in generate._actions:
        if action.dest in SHARED_FLAGS:
            parser._add_action(action)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every "
                             "interface)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument("--max-batch", type=int, default=4,
                        help="requests decoded together in one batch (default 4); more wait in the queue")
    parser.add_argument("--max-queue", type=int, default=64,
                        help="requests waiting for a batch slot (default 64); one more is answered 429")
    parser.add_argument("--depth-policy", default="cost", choices=DEPTH_POLICIES,
                        help="cost (default): each step's draft depth follows the batch (deep when alone, shallow "
                             "or none when the batch fills a pass; greedy replies are the same as alone, a seeded "
                             "sampled one depends on what it shared the batch with); fixed: the strategy's depth "
                             "always, so a seeded sampled reply is exactly the one it gets alone")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="reuse the cache entries of a prompt prefix that an earlier request computed (the "
                             "default; replies are the same either way, only the prefill's work changes; on for "
                             "the lean model on the CPU, where reuse is exact)")
    parser.add_argument("--api-key", default=os.environ.get(_API_KEY_ENV),
                        help=f"require 'Authorization: Bearer KEY' on /v1/ routes (default: ${_API_KEY_ENV}, "
                             f"else none)")
    parser.add_argument("--served-model-name", default=None,
                        help=f"the model id clients send and /v1/models lists (default {DEFAULT_MODEL_NAME} for "
                             f"the default model, else --model as given)")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0,
                        help="on SIGTERM or Ctrl-C, seconds that requests in flight get to finish before they "
                             "are aborted (default 10)")
    add_ray_flags(parser)
    return parser


def _check_flags(args: argparse.Namespace) -> GenerateSettings:
    if not 0 <= args.port <= 65535:
        raise SettingError("port", f"must be an integer in [0, 65535], got {args.port}")
    if args.max_batch < 1:
        raise SettingError("max_batch", f"must be an integer >= 1, got {args.max_batch}")
    if args.max_queue < 0:
        raise SettingError("max_queue", f"must be an integer >= 0, got {args.max_queue}")
    if args.api_key is not None and not args.api_key.strip():
        raise SettingError("api_key", "must not be empty")
    if not args.shutdown_timeout >= 0:
        raise SettingError("shutdown_timeout", f"must be a number of seconds >= 0, got {args.shutdown_timeout}")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise SettingError("served_model_name", "must not be empty")
    strategy = args.strategy
    if strategy is None and (args.draft == "retrieval" or (args.draft is None and args.model is None)):
        # the single-request default (a chain of up to 4 tokens) would make the cost policy time each of its
        # depths at start-up (11.8 against 3.4 s on one Zen 4 core), and the batch policy and its benchmarks
        # were tuned on one-token chains, which a batch rarely outgrows (docs/serving.md)
        strategy = DEFAULT_STRATEGY
    return resolve_settings(model=args.model, gguf_file=args.gguf_file, draft=args.draft, strategy=strategy,
                            verifier=args.verifier, dtype=args.dtype, device=args.device, threads=args.threads,
                            dual=args.dual, quantize=args.quantize, lean=args.lean,
                            kv_cache_dtype=args.kv_cache_dtype)


def served_model_name(args: argparse.Namespace) -> str:
    """The model id clients send and ``/v1/models`` lists."""
    return str(args.served_model_name or (args.model if args.model is not None else DEFAULT_MODEL_NAME))


def _log_config(quiet: bool) -> dict[str, Any]:
    """uvicorn's logging with the access log on stderr too (stdout is for text); ``quiet``: warnings only."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    if quiet:
        for logger in config["loggers"].values():
            logger["level"] = "WARNING"
    return config


def serve(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM or Ctrl-C; the exit status."""
    try:
        settings = _check_flags(args)
        ray_options = check_ray_flags(args)
    except SettingError as err:
        print(f"spec-fast: error: {err.cli_message()}", file=sys.stderr)
        return 2
    if ray_options is not None:  # the same app as Ray Serve replicas (spec_fast/serve/ray_cli.py)
        return serve_ray(args, settings, ray_options, served_model_name(args))
    try:
        import uvicorn

        from spec_fast.serve.app import ServeConfig, create_app
        from spec_fast.serve.worker import load_engine
    except ImportError as err:
        print(f"spec-fast: error: serve needs the serve extra ({err.name} is missing): "
              f"pip install 'spec-verify[serve]'", file=sys.stderr)
        return 2

    load_failure: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_error(err: BaseException) -> None:
        load_failure.append(err)
        if server is not None:
            server.should_exit = True

    config = ServeConfig(model_name=served_model_name(args), max_batch=args.max_batch, max_queue=args.max_queue,
                         api_key=args.api_key, on_load_error=on_load_error)
    app = create_app(lambda: load_engine(settings, args.max_batch, args.max_queue, args.depth_policy, args.quiet,
                                         args.enable_prefix_caching), config)
    grace_s = float(args.shutdown_timeout)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:  # the first signal: requests in flight get grace_s, then an error object
                app.state.server.begin_shutdown(grace_s)
            super().handle_exit(sig, frame)

    # uvicorn's own deadline is a backstop behind ours (it cancels what is left, which logs tracebacks)
    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_config=_log_config(args.quiet),
                                   lifespan="on", timeout_graceful_shutdown=int(grace_s) + 5, timeout_keep_alive=5))
    # uvicorn re-raises the signal that stopped it once it has shut down; SIGTERM's default action would turn
    # a clean shutdown into death by signal, so SIGTERM is ignored from then on (exit status 0)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server.run()
    if load_failure:
        failure = load_failure[0]
        if isinstance(failure, (ValueError, OSError)):  # SettingError included: a model that does not fit
            message = str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
            print(f"spec-fast: error: {message}", file=sys.stderr)
            return 2
        import traceback

        traceback.print_exception(failure, file=sys.stderr)
        return 1
    return 0 if server.started else 1
