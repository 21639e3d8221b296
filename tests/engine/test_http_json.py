"""The async JSON path of areal/engine/sglang/http.py (orjson) against a real aiohttp server on a
local port: what the server receives, and what an answer of each shape becomes."""

import asyncio
import json

from aiohttp import web

from areal.engine.sglang.http import apost_json

ANSWER = {"output_ids": [5, 6], "meta_info": {"output_token_logprobs": [[-0.5, 5, None], [-1.25, 6, None]]}}


async def echo(request):
    return web.json_response({"body": json.loads(await request.read()), "headers": dict(request.headers)})


async def empty(request):
    return web.Response(status=200, body=b"")


async def events(request):
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for chunk in ({"text": "a", "n": 1}, {"text": "ab", "n": 2}):
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


async def answer(request):
    return web.json_response(ANSWER)


async def with_server(test):
    app = web.Application()
    app.add_routes([web.post("/echo", echo), web.post("/empty", empty), web.post("/events", events)])
    app.add_routes([web.post("/generate", answer)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        return await test(f"127.0.0.1:{port}")
    finally:
        await runner.cleanup()


def post(addr, route, body, **kw):
    return apost_json(addr, route, body, timeout=30, retries=0, **kw)


def test_a_body_reaches_the_server_as_json_with_str_keys_and_the_callers_headers():
    async def test(addr):
        body = {"input_ids": [1, 2, 3], "sampling_params": {"logit_bias": {7: -1.5}, "sampling_seed": 2**63 - 1}}
        return await post(addr, "/echo", body, headers={"Authorization": "Bearer k"})

    got = asyncio.run(with_server(test))
    sent = {"logit_bias": {"7": -1.5}, "sampling_seed": 2**63 - 1}
    assert got["body"] == {"input_ids": [1, 2, 3], "sampling_params": sent}
    assert got["headers"]["Content-Type"] == "application/json"
    assert got["headers"]["Authorization"] == "Bearer k"


def test_answers_parse_to_the_same_python_values_as_the_json_module():
    async def test(addr):
        return (
            await post(addr, "/generate", {}),
            await post(addr, "/empty", {}),
            await post(addr, "/events", {}, stream=True),
        )

    whole, nothing, streamed = asyncio.run(with_server(test))
    assert whole == ANSWER and isinstance(whole["meta_info"]["output_token_logprobs"][0][0], float)
    assert nothing is None
    assert streamed == [{"text": "a", "n": 1}, {"text": "ab", "n": 2}]
