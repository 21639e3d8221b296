"""HTTP transport to inference servers: JSON posts with retries, async and blocking.

aiohttp sessions: an aiohttp session is bound to one event loop, and the client's coroutines run
on whatever loop calls them (the rollout executor's thread, a test's asyncio.run, a notebook).
Inside `shared_session()` (the rollout executor's loop runs in one) requests on that loop share one
session and its keep-alive connections; elsewhere each request opens its own. The session per
request cost little wall time but a lot of Python: creating, connecting and closing sessions
takes time on the executor thread, which in an asynchronous run is taken from the training thread
through the GIL. Blocking calls (weight updates, pause/continue) use `requests` in threads so they
can fan out to every server at once from synchronous trainer code.

Errors always name the server (`host:port`) and the route: with several servers, "connection
refused" alone does not say which one went away.

JSON on the async path goes through orjson: the rollout thread parses every answer (a token id
and a logprob per generated token), and each millisecond it holds the GIL is one the training
thread waits; orjson parses a 192-token answer in a fifth of the json module's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import orjson

from areal.infra.sockets import is_out_of_files, out_of_files_text

JSON_HEADERS = {"Content-Type": "application/json"}
RETRY_STATUS = {502, 503, 504}  # the server (or a proxy) is restarting or overloaded
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
BUSY_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)  # a full server (503) makes room as requests finish


class ServerError(RuntimeError):
    """A server did not answer properly; `.addr` names it, `.status` is the HTTP status of an
    error answer (None when none came)."""

    def __init__(self, addr: str, route: str, message: str, status: int | None = None):
        self.addr = addr
        self.route = route
        self.status = status
        super().__init__(f"inference server {addr} ({route}): {message}")


def _backoff(attempt: int) -> float:
    return BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]


def retries_for(seconds: float) -> int:
    """The fewest retries whose backoff adds up to at least `seconds` (outlasting a restart)."""
    n, waited = 0, 0.0
    while waited < seconds:
        waited += _backoff(n)
        n += 1
    return n


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


_LOOP_SESSIONS: dict = {}  # event loop -> the ClientSession its requests share (shared_session)


@contextlib.asynccontextmanager
async def shared_session(limit_per_host: int = 0, **session_kwargs):
    """Within this scope, requests made on the running loop share one ClientSession (keep-alive
    connections, no overall limit: hundreds of generations are in flight at once).
    `limit_per_host`: most connections to one server, the requests it can hold (its running
    batch plus its queue): a request past it waits here for a connection (back-pressure) instead
    of being answered 503 and asked again; 0 is no limit. session_kwargs go to
    aiohttp.ClientSession (e.g. trace_configs)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=limit_per_host)
    session = aiohttp.ClientSession(connector=connector, **session_kwargs)
    _LOOP_SESSIONS[loop] = session
    try:
        yield session
    finally:
        _LOOP_SESSIONS.pop(loop, None)
        await session.close()


async def apost_json(
    addr: str,
    route: str,
    body: dict,
    *,
    timeout: float,
    retries: int,
    headers: dict[str, str] | None = None,
    stream: bool = False,
) -> Any:
    """POST `body` to http://addr/route and return the JSON answer (`stream`: the list of the
    server-sent events' JSON payloads, up to `data: [DONE]`; see read_events).

    Connection errors, 502 and 504 are retried `retries` times with backoff; other HTTP errors
    fail at once (a bad request does not get better by repeating it). A 503 is a full server
    (the built-in server past --max-running-requests + --max-queued-requests) or one restarting:
    back-pressure, so it is asked again, with backoff, for as long as `timeout` allows, and only
    then is an error that carries the server's own message (which names its limit).
    """
    import aiohttp

    last = ""
    failures = busy = 0
    start = time.monotonic()
    while True:
        try:
            status, answer = await _post_once(addr, route, body, timeout, headers, stream)
        except aiohttp.ClientConnectionError as e:  # a kept-alive connection to a restarted server too
            if is_out_of_files(e):  # retrying would only hide the limit
                raise ServerError(addr, route, out_of_files_text(e)) from e
            last = f"{type(e).__name__}: {e}"
        else:
            if status == 503:
                await _wait_while_full(addr, route, answer, start, timeout, busy)
                busy += 1
                continue
            if status in RETRY_STATUS:
                last = f"HTTP {status}: {answer[:300]}"
            elif status >= 400:
                raise ServerError(addr, route, f"HTTP {status}: {answer[:1000]}", status)
            else:
                return answer
        failures += 1
        if failures > retries:
            raise ServerError(
                addr,
                route,
                f"unreachable after {retries + 1} attempts ({last}); is the server "
                "still running? (retries: rollout.request_retries)",
            )
        await asyncio.sleep(_backoff(failures - 1))


async def _post_once(
    addr: str, route: str, body: dict, timeout: float, headers, stream: bool = False
) -> tuple[int, Any]:
    """One POST through the loop's shared session (shared_session), else a session of its own."""
    import aiohttp

    try:
        shared = _LOOP_SESSIONS.get(asyncio.get_running_loop())
        if shared is not None and not shared.closed:
            return await _post(shared, addr, route, body, timeout, headers, stream)
        async with aiohttp.ClientSession() as session:
            return await _post(session, addr, route, body, timeout, headers, stream)
    except asyncio.TimeoutError:
        raise ServerError(
            addr,
            route,
            f"no answer within {timeout:.0f}s (rollout.request_timeout_s); raise it for long generations",
        ) from None


async def _wait_while_full(addr: str, route: str, answer: Any, start: float, timeout: float, busy: int) -> None:
    """Back off after a 503 (a full server); past `timeout` since `start`, the server's own message."""
    waited = time.monotonic() - start
    if waited >= timeout:
        raise ServerError(
            addr,
            route,
            f"still full after {waited:.0f} s (rollout.request_timeout_s): HTTP 503: {answer[:600]}",
        )
    pause = BUSY_BACKOFF_S[min(busy, len(BUSY_BACKOFF_S) - 1)]
    await asyncio.sleep(min(pause, max(0.0, timeout - waited)))


async def _post(
    session, addr: str, route: str, body: dict, timeout: float, headers, stream: bool = False
) -> tuple[int, Any]:
    """(status, parsed JSON, or the events' payloads when `stream`) for a 2xx/3xx answer, (status,
    text) otherwise."""
    import aiohttp

    async with session.post(
        f"http://{addr}{route}",
        data=orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS),  # str keys, as the json module writes
        headers={**JSON_HEADERS, **(headers or {})},
        timeout=aiohttp.ClientTimeout(total=timeout),
    ) as resp:
        if resp.status >= 400:
            return resp.status, await resp.text()
        if stream:
            return resp.status, await read_events(resp.content)
        raw = await resp.read()
        return resp.status, orjson.loads(raw) if raw.strip() else None


async def read_events(content) -> list[Any]:
    """The JSON payloads of server-sent events (`data: {...}` blocks separated by a blank line) up
    to `data: [DONE]` or the end of the body. Read in raw pieces and split here: a chunk holding a
    long answer's output so far is larger than aiohttp's longest line."""
    events: list[Any] = []
    buffer = b""

    def take(blocks: list[bytes]) -> bool:  # whether [DONE] came
        for block in blocks:
            data = b"".join(line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:"))
            if data == b"[DONE]":
                return True
            if data:
                events.append(orjson.loads(data))
        return False

    async for piece in content.iter_any():
        *blocks, buffer = (buffer + piece).split(b"\n\n")
        if take(blocks):
            return events
    take([buffer])  # a last event without its blank line
    return events


def post_json(
    addr: str,
    route: str,
    body: dict | None,
    *,
    timeout: float,
    retries: int = 0,
    headers: dict[str, str] | None = None,
    timeout_key: str | None = None,
) -> Any:
    """Blocking POST with the same retry rules as `apost_json`; a server that takes the connection
    and does not answer within `timeout` is an error naming it and `timeout_key`, the setting."""
    import requests

    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(_backoff(attempt - 1))
        try:
            resp = requests.post(f"http://{addr}{route}", json=body, headers=headers, timeout=timeout)
        except requests.Timeout:
            raise ServerError(addr, route, f"no answer within {timeout:g} s{_setting(timeout_key)}") from None
        except requests.ConnectionError as e:
            last = f"connection error: {e}"
            continue
        if resp.status_code in RETRY_STATUS:
            last = f"HTTP {resp.status_code}: {resp.text[:300]}"
            continue
        if resp.status_code >= 400:
            raise ServerError(addr, route, f"HTTP {resp.status_code}: {resp.text[:1000]}", resp.status_code)
        if not resp.content:
            return {}
        try:
            return resp.json()
        except ValueError:  # a plain-text answer (/flush_cache)
            return resp.text
    raise ServerError(addr, route, f"unreachable after {retries + 1} attempts ({last})")


def get_json(
    addr: str, route: str, *, timeout: float, headers: dict[str, str] | None = None, timeout_key: str | None = None
) -> Any:
    import requests

    try:
        resp = requests.get(f"http://{addr}{route}", headers=headers, timeout=timeout)
    except requests.Timeout:
        raise ServerError(addr, route, f"no answer within {timeout:g} s{_setting(timeout_key)}") from None
    except requests.RequestException as e:
        raise ServerError(addr, route, f"{type(e).__name__}: {e}") from None
    if resp.status_code >= 400:
        raise ServerError(addr, route, f"HTTP {resp.status_code}: {resp.text[:1000]}", resp.status_code)
    return resp.json()


def _setting(key: str | None) -> str:
    return f" ({key}; is the server stopped or hung?)" if key else ""


def fanout(addrs: list[str], call: Callable[[int, str], Any]) -> list[Any]:
    """Run `call(index, addr)` for every server at once; all answers, or one error naming
    every server that failed (the others' calls still completed)."""
    if not addrs:
        return []
    with ThreadPoolExecutor(max_workers=len(addrs), thread_name_prefix="sglang-fanout") as pool:
        futures = [pool.submit(call, i, a) for i, a in enumerate(addrs)]
        results, errors = [], []
        for addr, fut in zip(addrs, futures):
            try:
                results.append(fut.result())
            except Exception as e:
                errors.append(f"{addr}: {e}")
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(addrs)} inference servers failed:\n  " + "\n  ".join(errors))
    return results
