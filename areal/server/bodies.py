"""Request bodies and error replies of the built-in server: what every route family (routes_*.py,
openai_api.py) and app.py's middleware use (a module of its own, so none imports another for it).

`read_json` reads a request's JSON object body within the size limit `max_body_bytes`
(413 beyond it, 415 for a non-JSON Content-Type, 400 for invalid JSON or a non-object);
`error` builds SGLang's error reply, `{"error": {"message": ...}}`.
"""

from __future__ import annotations

import json

from aiohttp import web

from areal.server.validation import BadRequest, UnsupportedMediaType, require_object

MIN_BODY_BYTES = 4 * 2**20
BODY_BYTES_PER_TOKEN = 64  # generous: a token id or a token's text, JSON-escaped, is far smaller


def max_body_bytes(context_length: int) -> int:
    """Largest request body read: room for a prompt of the whole context, at least 4 MiB."""
    return max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * context_length)


class PayloadTooLarge(BadRequest):
    status = 413


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


async def read_json(request: web.Request, *, allow_empty: bool = False) -> dict:
    """The JSON object body; a non-JSON Content-Type, an oversized body, invalid JSON (bad
    UTF-8, nesting too deep, a huge integer literal) or a non-object is a BadRequest."""
    ctype = request.headers.get("Content-Type")
    if ctype is not None and not _is_json_type(request.content_type):
        raise UnsupportedMediaType(
            f"{request.path}: Content-Type {ctype!r} is not JSON; send the body as "
            "application/json (curl: -H 'Content-Type: application/json')."
        )
    limit = max_body_bytes(request.app["state"].context_length)
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(_too_large(request.path, request.content_length, limit))
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(_too_large(request.path, None, limit)) from None
    if not raw.strip():
        if allow_empty:
            return {}
        raise BadRequest(f"{request.path}: the request needs a JSON body.")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, digits
        raise BadRequest(f"{request.path}: invalid JSON body: {str(exc)[:200]}.") from None
    return require_object(body, request.path)


def _is_json_type(content_type: str) -> bool:
    return content_type == "application/json" or content_type.endswith("+json")


def _too_large(path: str, size: int | None, limit: int) -> str:
    what = f"{size} bytes" if size is not None else "the body"
    return (
        f"{path}: {what} exceeds this server's request size limit of {limit} bytes "
        f"({BODY_BYTES_PER_TOKEN} bytes per token of the context length, at least "
        f"{MIN_BODY_BYTES}): no valid request is that large; send a shorter prompt."
    )
