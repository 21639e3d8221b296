"""/generate, SGLang's native generation route, and what every generating route shares of it.

/health_generate (routes_info.py) and the OpenAI routes (openai_api.py) generate through the same
pieces, so pauses, memory release and the request cap treat all traffic alike: admission (the
KV budget, released memory, --max-running-requests + --max-queued-requests, the pause gate), a
run on the scheduler's worker thread that the event loop awaits, and SGLang's output shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

from aiohttp import web

from areal.server.bodies import error, read_json
from areal.server.memory import released_message
from areal.server.scheduler import Sequence
from areal.server.state import Routes
from areal.server.validation import BadRequest, parse_generate


class ServerFull(BadRequest):
    """The server already holds as many requests as it may: HTTP 503, retry later."""

    status = 503


class GenerateRoutes(Routes):
    """/generate, plus admission, running and output formatting for the other generating routes."""

    async def generate(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        inp = parse_generate(
            body, vocab_size=self.s.runner.vocab_size, context_length=self.s.context_length, tokenize=self._tokenize()
        )
        if inp.sampling.stop and self.s.tokenizer is None:
            raise BadRequest(
                "sampling_params: 'stop' strings need a tokenizer, but the server "
                "runs with --skip-tokenizer-init; use 'stop_token_ids'."
            )
        rid = inp.rid or uuid.uuid4().hex
        if rid in self.s.inflight:
            raise BadRequest(f"/generate: rid {rid!r} is already in flight; rids must be unique.")
        if inp.lora_path is not None:
            self._check_lora(inp.lora_path)  # fail fast, before waiting out a pause
        self.check_fits(len(inp.input_ids) + inp.sampling.max_new_tokens)
        async with self.admitted():
            if inp.lora_path is not None:  # checked again with no await before the submit
                await self.s.lora_idle.wait()
                self._check_lora(inp.lora_path)
            if inp.stream:
                return await self.stream(request, rid, inp)
            seq = await self.run(rid, inp.input_ids, inp.sampling, inp.return_logprob)
        reason = seq.finish_reason
        if refused(seq):
            return error(reason["status_code"], reason["message"])  # refused by the scheduler
        return web.json_response(self.output(seq, inp.return_text_in_logprobs))

    async def stream(self, request: web.Request, rid: str, inp) -> web.StreamResponse:
        """SGLang's streamed /generate: server-sent events `data: {...}`, one every
        sampling_params.stream_interval tokens and one at the end, then `data: [DONE]`. Each chunk
        holds the whole output so far (SGLang without --incremental-streaming-output), with
        finish_reason null until the last and weight_version the server's as the chunk is written
        (a chunk written after a weight update says the new version, as SGLang's tokenizer manager
        does; output_version_spans says which tokens each version made). A request the scheduler
        refuses ends with a `data: {"error": ...}` chunk. A client that goes away aborts it."""
        loop = asyncio.get_running_loop()
        counts: asyncio.Queue = asyncio.Queue()
        interval = inp.stream_interval

        def on_token(seq):  # worker thread
            n = len(seq.output_ids)
            if n % interval == 0:
                loop.call_soon_threadsafe(counts.put_nowait, (seq, n))

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        task = asyncio.ensure_future(self.run(rid, inp.input_ids, inp.sampling, inp.return_logprob, on_token=on_token))
        # the end comes after every token's count: the worker thread hands both over in order
        task.add_done_callback(lambda _: counts.put_nowait(None))
        try:
            while (item := await counts.get()) is not None:
                seq, n = item
                await write_event(resp, self.output(seq, inp.return_text_in_logprobs, upto=n))
            seq = await task
            if refused(seq):
                reason = seq.finish_reason
                await write_event(resp, {"error": {"message": reason["message"], "code": reason["status_code"]}})
            else:
                await write_event(resp, self.output(seq, inp.return_text_in_logprobs))
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionError, asyncio.CancelledError):  # the client went away: stop generating
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        await resp.write_eof()
        return resp

    # ---- admission ----------------------------------------------------------------------------
    def check_fits(self, tokens: int) -> None:
        """Refuse at once a request that cannot run: `tokens` of KV cache (prompt +
        max_new_tokens) beyond the whole budget, or memory released (the scheduler checks
        again at submit)."""
        self._check_kv_budget(tokens)
        released = self.s.scheduler.memory_released
        if released:
            raise BadRequest(released_message("/generate", released))

    @contextlib.asynccontextmanager
    async def admitted(self):
        """Count the request as inside the server (ServerFull past its capacity), then hold it
        while generation is paused, as SGLang holds new requests."""
        if self.s.accepted >= self.s.capacity:
            raise ServerFull(self.full_message())
        self.s.accepted += 1
        try:
            await self.s.gate.wait()
            yield
        finally:
            self.s.accepted -= 1

    def full_message(self) -> str:
        a = self.s.args
        return (
            f"/generate: the server is full: {self.s.accepted} requests are already in it "
            f"(--max-running-requests {a.max_running_requests} running + "
            f"--max-queued-requests {a.max_queued_requests} waiting). Retry later, spread "
            "the load over more servers, or raise --max-queued-requests "
            "(sglang.max_queued_requests)."
        )

    def _check_kv_budget(self, tokens: int) -> None:
        """A request whose own worst-case KV cache exceeds the whole budget can never run."""
        budget = self.s.scheduler.max_total_tokens
        if budget is not None and tokens > budget:
            raise BadRequest(
                f"/generate: the request needs {tokens} KV cache tokens (prompt + "
                f"max_new_tokens), more than the server's whole KV budget, "
                f"max_total_num_tokens {budget} (set by {self._budget_source()}); lower "
                "max_new_tokens or shorten the prompt, or restart the server with a higher "
                "--mem-fraction-static (or --max-total-tokens)."
            )

    def _budget_source(self) -> str:
        budget = self.s.kv_budget
        return budget.limited_by if budget is not None else "--max-total-tokens"

    def _check_lora(self, lora_path: str) -> None:
        try:
            self.s.updater.lora.check_request(lora_path)
        except ValueError as exc:
            raise BadRequest(f"/generate: {exc}") from None

    def _tokenize(self):
        tok = self.s.tokenizer
        if tok is None:
            return None
        return lambda text: tok(text, add_special_tokens=False).input_ids

    # ---- running ------------------------------------------------------------------------------
    async def run(self, rid: str, input_ids, sampling, return_logprob: bool, on_token=None) -> Sequence:
        """Generate one sequence on the worker thread; a client that goes away aborts it.
        `on_token(seq)`, if given, runs on the worker thread after each token (Sequence.on_token)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_finish(seq):  # worker thread
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(seq))

        stop_ids = [] if sampling.ignore_eos else sorted(self.s.eos_ids | sampling.stop_token_ids)
        spans = [(0, self.s.weight_version)]
        seq = Sequence(rid, input_ids, sampling, return_logprob, on_finish, stop_ids=stop_ids, version_spans=spans)
        seq.on_token = on_token
        self.s.inflight[rid] = seq
        try:
            self.s.scheduler.submit(seq)
            return await asyncio.shield(done)
        except asyncio.CancelledError:  # client went away: stop spending compute on it
            self.s.scheduler.abort(rid, "Client disconnected.")
            raise
        finally:
            self.s.inflight.pop(rid, None)

    # ---- output -------------------------------------------------------------------------------
    def output(self, seq: Sequence, text_in_logprobs: bool, upto: int | None = None) -> dict:
        """SGLang's /generate response: text (stop trimmed), output_ids (untrimmed), meta_info.
        `upto`: a streamed chunk of the first `upto` tokens while the sequence still runs (its
        finish_reason null)."""
        ids = seq.output_ids[:upto]  # a copy: the worker thread appends meanwhile
        reason = seq.finish_reason if upto is None else None
        meta = {
            "id": seq.rid,
            "finish_reason": reason,
            "prompt_tokens": len(seq.input_ids),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": self.s.weight_version,
            "output_version_spans": version_spans(seq, len(ids)),
            "total_retractions": seq.retractions,
            "e2e_latency": time.time() - seq.created,
        }
        if seq.return_logprob:
            meta["input_token_logprobs"] = [[None, seq.input_ids[-1], None]]
            meta["output_token_logprobs"] = [
                [lp, tid, self.token_text(tid) if text_in_logprobs else None]
                for lp, tid in zip(seq.output_logprobs[: len(ids)], ids)
            ]
        out = {"output_ids": ids, "meta_info": meta}
        if self.s.tokenizer is not None:
            out = {"text": self.text(seq, upto), **out}
        return out

    def text(self, seq: Sequence, upto: int | None = None) -> str:
        """The decoded output, the matched stop token or string cut off unless no_stop_trim (of the
        first `upto` tokens while the sequence runs: nothing matched yet)."""
        ids = seq.output_ids[:upto]
        matched = seq.finish_reason.get("matched") if upto is None else None
        trim = not seq.params.no_stop_trim
        if trim and isinstance(matched, int) and not isinstance(matched, bool) and ids:
            ids = ids[:-1]
        text = self.s.tokenizer.decode(ids, skip_special_tokens=seq.params.skip_special_tokens)
        if trim and isinstance(matched, str) and matched in text:
            text = text[: text.find(matched)]
        return text

    def token_text(self, tid: int) -> str | None:
        return None if self.s.tokenizer is None else self.s.tokenizer.decode([tid])


def refused(seq: Sequence) -> bool:
    """Whether the scheduler refused the request (an abort carrying an HTTP status)."""
    reason = seq.finish_reason
    return reason["type"] == "abort" and reason.get("status_code") in (400, 500)


async def write_event(resp: web.StreamResponse, payload: dict) -> None:
    await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def version_spans(seq: Sequence, n_tokens: int | None = None) -> list[list]:
    """`[[start, version], ...]`: output tokens from `start` on (to the next start) came from
    weights of `version`, over the first `n_tokens` (default all). Beyond SGLang's answer, which
    has only the version at the end: with pause_mode in_place or retract a request lives through
    weight updates, and the client labels each token with the version that produced it."""
    n_tokens = len(seq.output_ids) if n_tokens is None else n_tokens
    spans: list[list] = []
    for start, version in seq.version_spans:
        if start >= n_tokens and spans:
            break  # a change after the last token produced nothing
        if spans and spans[-1][0] == start:
            spans[-1][1] = version  # two changes before the next token: the later one counts
        elif not spans or spans[-1][1] != version:
            spans.append([start, version])
    return spans
