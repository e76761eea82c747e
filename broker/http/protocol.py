"""What every answer of the API carries and what aiohttp answers on its own: the
``Server: fedbroker`` header (no versions), ``X-Content-Type-Options: nosniff`` and, on
JSON, ``Cache-Control: no-store``; and the low-level parser errors (a bad request line, a
bad method, a header too long or with control characters) as the API's one-line JSON.

aiohttp answers those parser errors itself, in plain text, before any middleware runs
(aio-libs/aiohttp#3287 asks for a hook; there is none), so ``json_parser_errors`` wraps
``RequestHandler.handle_error``. The answer never repeats what the client sent: a
malformed header may carry a token. Nor does the log: aiohttp logs each parser error
with its traceback at error level (the exception holds the raw line); here it is one
line at warning naming the peer and the problem in the API's words.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import http_exceptions, web, web_protocol

SERVER = "fedbroker"

# The parser's errors, by class, in the API's words; the first match wins (subclasses first).
_PARSER_ERRORS: tuple[tuple[type[Exception], str], ...] = (
    (http_exceptions.LineTooLong, "headers: a request line or header is too long"),
    (http_exceptions.BadHttpMethod, "method: not a valid HTTP method"),
    (http_exceptions.InvalidURLError, "path: not a valid URL"),
    (http_exceptions.BadStatusLine, "request: malformed request line"),
    (http_exceptions.InvalidHeader, "headers: a malformed header"),
    (http_exceptions.PayloadEncodingError, "body: malformed encoding"),
)
_BY_STATUS = {
    400: "request: malformed HTTP request",
    413: "body: too large",
    431: "headers: too large",
    500: "server: internal error",
    504: "server: timed out",
}


def parser_error_message(status: int, exc: BaseException | None) -> str:
    """The one-line message for an error aiohttp answers itself (never the input)."""
    for kind, message in _PARSER_ERRORS:
        if isinstance(exc, kind):
            return message
    return _BY_STATUS.get(status, f"request: refused ({status})")


_plain_handle_error = web_protocol.RequestHandler.handle_error


def _json_handle_error(
    self: web_protocol.RequestHandler,
    request: Any,
    status: int = 500,
    exc: BaseException | None = None,
    message: str | None = None,
) -> web.StreamResponse:
    text = parser_error_message(status, exc)
    if isinstance(exc, http_exceptions.HttpProcessingError):
        _log_malformed(self, request, status, exc, text)
    else:  # a handler's bug (500) or timeout (504): aiohttp's own log, with the traceback
        status = _plain_handle_error(self, request, status, exc, message).status
    body = json.dumps({"error": text})
    response = web.Response(status=status, text=body, content_type="application/json")
    response.headers.update(_COMMON)
    response.headers["Cache-Control"] = "no-store"
    response.force_close()
    return response


_COMMON = {"Server": SERVER, "X-Content-Type-Options": "nosniff"}


def _log_malformed(
    handler: web_protocol.RequestHandler,
    request: Any,
    status: int,
    exc: http_exceptions.HttpProcessingError,
    text: str,
) -> None:
    """A client's malformed request: one line, no traceback (it is no fault of ours, and
    the exception would repeat the raw input); what aiohttp logs at debug stays there (a
    first request whose method is not HTTP: a scanner, or TLS sent to a plain port)."""
    quiet = handler._request_count == 1 and isinstance(exc, http_exceptions.BadHttpMethod)
    level = logging.DEBUG if quiet else logging.WARNING
    handler.logger.log(level, "malformed request from %s: %s (%d)", request.remote, text, status)
    if request.writer.output_size > 0:  # as aiohttp: an answer was on its way already
        raise ConnectionError("Response is sent already, cannot send another one")


def json_parser_errors() -> None:
    """aiohttp's own error answers as one-line JSON (idempotent; for every server of the
    process, the API's being the only one a broker runs)."""
    web_protocol.RequestHandler.handle_error = _json_handle_error  # type: ignore[method-assign]


async def common_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: no versions in ``Server``, no sniffing, JSON never cached
    (it may be a tenant's jobs)."""
    response.headers.update(_COMMON)
    if response.content_type == "application/json":
        response.headers["Cache-Control"] = "no-store"


__all__ = ["SERVER", "common_headers", "json_parser_errors", "parser_error_message"]
