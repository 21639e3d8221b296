"""The aiohttp replies the server's /v1 routes and the rollout proxy both send."""

from __future__ import annotations

from aiohttp import web

from areal.chat.request import RequestError
from areal.chat.response import error_body, sse_events


def request_error_reply(exc: RequestError) -> web.Response:
    return web.json_response(error_body(str(exc), status=exc.status, param=exc.param, code=exc.code), status=exc.status)


async def reply(request: web.Request, body: dict, chunks: list[dict] | None) -> web.StreamResponse:
    """`body` as JSON, or, for a streaming request (`chunks` given), the chunks as server-sent
    events ending with `data: [DONE]`."""
    if chunks is None:
        return web.json_response(body)
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for event in sse_events(chunks):
        await resp.write(event)
    await resp.write_eof()
    return resp
