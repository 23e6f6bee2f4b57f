"""``spec-fast serve``: an OpenAI-compatible HTTP server over the continuous-batching engine.

Modules: :mod:`~spec_fast.serve.cli` (the command and its flags; imports nothing heavy),
:mod:`~spec_fast.serve.app` (the FastAPI routes and admission control), :mod:`~spec_fast.serve.protocol`
(request bodies, response objects), :mod:`~spec_fast.serve.generation` (one request's response or stream),
:mod:`~spec_fast.serve.worker` (the engine thread), :mod:`~spec_fast.serve.metrics` (Prometheus),
:mod:`~spec_fast.serve.errors` (OpenAI error objects). All but ``cli`` need the ``serve`` extra
(FastAPI, uvicorn, prometheus-client). docs/serving.md describes the API.
"""
