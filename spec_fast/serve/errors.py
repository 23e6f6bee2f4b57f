"""OpenAI-style error objects: every refusal is ``{"error": {"message", "type", "param", "code"}}``.

Status codes (docs/serving.md): 400 a well-formed request the server does not serve (``n > 1``, logprobs, a
prompt longer than the context, malformed JSON), 401 a missing or wrong API key, 404 an unknown route or
model, 405 a wrong method, 413 a body over :data:`MAX_BODY_BYTES`, 422 a body that does not match the schema
(a missing field, a wrong type, a value out of range), 429 a full queue, 503 while the model loads or the
server shuts down, 500 a failure of ours (logged with its traceback on stderr, never sent to the client).
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["APIError", "error_body", "install_error_handlers", "BodyLimit", "send_error", "MAX_BODY_BYTES"]

#: Larger request bodies are refused with 413 before they are parsed. 4 MiB holds a prompt of about a
#: million characters, more than the context of the models this engine runs (SmolLM2: 8192 tokens).
MAX_BODY_BYTES = 4 * 2**20

#: The OpenAI error ``type`` for each status we send
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}


class APIError(Exception):
    """A refusal sent to the client as an OpenAI error object with HTTP status ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


def _validation_error(err: RequestValidationError) -> APIError:
    errors = err.errors()
    first = errors[0] if errors else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":  # not JSON at all: the request is malformed, not unprocessable
        return APIError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".strip(),
                        None, "invalid_json")
    if not location and first.get("type") in ("model_attributes_type", "dict_type", "missing"):
        # no body, or one that is not a JSON object (a form, plain text, a list)
        return APIError(400, "the request body must be a JSON object (Content-Type: application/json)", None,
                        "invalid_json")
    param = ".".join(location) or None
    message = str(first.get("msg", "invalid request"))
    return APIError(422, f"{param}: {message}" if param else message, param, "invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI/Starlette raise, and any unexpected exception, through :class:`APIError`."""

    async def on_api_error(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, APIError)
        return err.response()

    async def on_validation(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, RequestValidationError)
        return _validation_error(err).response()

    async def on_http(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, StarletteHTTPException)
        if isinstance(err.__cause__, APIError):  # FastAPI turns any error while reading the body into a 400
            return err.__cause__.response()
        if err.status_code == 404:
            return APIError(404, f"no route {request.method} {request.url.path}", None, "not_found").response()
        if err.status_code == 405:
            return APIError(405, f"{request.method} is not allowed on {request.url.path}", None,
                            "method_not_allowed").response()
        return APIError(err.status_code, str(err.detail)).response()

    async def on_unexpected(request: Request, err: Exception) -> JSONResponse:
        # the traceback is ours to read on stderr; the client learns only that the server failed
        traceback.print_exception(err, file=sys.stderr)
        return APIError(500, "internal server error (see the server's log)", None, "internal_error").response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


class BodyLimit:
    """ASGI middleware: 413 for a request body over ``limit`` bytes, by its Content-Length before reading
    or by counting a chunked body as it arrives."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:  # a chunked body: the error handlers answer 413
                    raise self._error()
            return message

        await self.app(scope, counting_receive, send)

    def _error(self) -> APIError:
        return APIError(413, f"the request body exceeds {self.limit} bytes", None, "request_too_large")

    async def _refuse(self, send: Send) -> None:
        await send_error(send, self._error())


async def send_error(send: Send, error: APIError) -> None:
    """Answer with ``error`` from ASGI middleware (outside FastAPI's exception handlers)."""
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
