"""Why SGLang 0.5.16's abort-mode /pause_generation can wait a whole second after every request
has its answer: a CPU reproduction with SGLang's own RWLock behind a FastAPI app on uvloop, shaped
like its non-streamed /generate (the handler awaits the first item of an async generator that
holds the lock's reader side and leaves it suspended) and its abort pause (check the lock at once,
then sleep a second while it is held).

    pip install --no-deps sglang==0.5.16 && pip install fastapi uvicorn uvloop aiohttp
    python scripts/dev/pause_lock_race.py --requests 510 --trials 5

Each trial posts --requests answers that wait on one event, sets it (the "abort"), waits for all
answers, then posts the pause at once and prints how long it took, how many readers it found
still held, and how long after the last handler returned it came. The server runs in a process of
its own, as SGLang's tokenizer manager does. On 2026-12-07 (2 cores, Python 3.11) 3 of 6 trials
found 1-9 readers still held 4.5-5.4 ms after the last answer and took 1.000 s; the others found
none. The SmolLM2 recipe on SGLang spent 1.003 s in /pause_generation in 2 of 12 updates after a
drain that had every request answered (docs/architecture.md, the pause).
ServerControl._server_pause_mode is the answer to it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing
import pathlib
import time

import aiohttp
import uvicorn
from fastapi import FastAPI


def sglang_rwlock() -> type:
    """SGLang's RWLock, loaded from its file: importing the sglang package needs its GPU stack."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise SystemExit("sglang is not installed here: pip install --no-deps sglang==0.5.16")
    path = pathlib.Path(spec.origin).parent / "srt" / "utils" / "aio_rwlock.py"
    module_spec = importlib.util.spec_from_file_location("sglang_aio_rwlock", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.RWLock


app = FastAPI()
lock = sglang_rwlock()()
state: dict = {}


async def wait_one_response():
    # SGLang's _wait_one_response polls its event with a timeout (SGLANG_REQUEST_STATE_WAIT_TIMEOUT)
    while True:
        try:
            await asyncio.wait_for(state["event"].wait(), timeout=0.2)
        except asyncio.TimeoutError:
            continue
        break
    yield {"finish_reason": "abort"}


async def generate_request():
    async with lock.reader_lock:
        async for response in wait_one_response():
            yield response


@app.post("/generate")
async def generate():
    answer = await generate_request().__anext__()  # as http_server.generate_request does
    state["last_return"] = time.perf_counter()
    return answer


@app.post("/reset")
async def reset():
    state["event"] = asyncio.Event()


@app.post("/abort")
async def abort():
    state["event"].set()


@app.post("/pause")
async def pause():
    t0 = time.perf_counter()
    held, checks = lock._readers, 0
    while True:  # tokenizer_manager.pause_generation, mode abort
        checks += 1
        if not await lock.is_locked():
            break
        await asyncio.sleep(1.0)
    return {
        "pause_s": round(time.perf_counter() - t0, 4),
        "checks": checks,
        "readers_held_at_arrival": held,
        "after_last_answer_s": round(t0 - state["last_return"], 4),
    }


async def trials(url: str, n: int, count: int) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for trial in range(count):
            await session.post(f"{url}/reset")

            async def one():
                async with session.post(f"{url}/generate") as answer:
                    return await answer.json()

            posted = [asyncio.create_task(one()) for _ in range(n)]
            await asyncio.sleep(1.0)  # long enough for the handlers' waits to time out a few times
            await session.post(f"{url}/abort")
            await asyncio.gather(*posted)
            async with session.post(f"{url}/pause") as answer:
                print(trial, await answer.json())


def serve(port: int) -> None:
    uvicorn.run(app, port=port, loop="uvloop", log_level="warning")


async def wait_until_served(url: str, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.post(f"{url}/reset"):
                    return
            except aiohttp.ClientConnectionError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the reproduction's server at {url} did not answer within {deadline_s:g} s")
                await asyncio.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=510)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    server = multiprocessing.Process(target=serve, args=(args.port,), daemon=True)  # its own GIL, as SGLang's
    server.start()
    try:
        asyncio.run(wait_until_served(url))
        asyncio.run(trials(url, args.requests, args.trials))
    finally:
        server.terminate()
        server.join(10)


if __name__ == "__main__":
    main()
