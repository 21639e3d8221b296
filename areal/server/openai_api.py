"""OpenAI's /v1/models, /v1/chat/completions and /v1/completions on the built-in server (SGLang
serves all three).

Request fields, response shapes and tool-call parsing are areal/chat's (shared with the rollout
proxy): the tokenizer's chat template renders messages and tools, `<tool_call>{json}</tool_call>`
blocks become `tool_calls` (finish_reason "tool_calls"), a malformed call comes back as raw text
in `content`, and unknown fields are a 400 naming them. Sampling defaults are SGLang's: the
budget is whatever the context leaves (max_tokens absent), temperature 1, top_p 1.

Each choice is one /generate sequence and is admitted as /generate admits requests (the KV
budget, released memory, --max-running-requests + --max-queued-requests, the pause gate:
routes_generate.py), so
pauses and weight updates treat OpenAI traffic like any other. `return_meta_info` gives a
choice the /generate meta_info (weight_version, output_version_spans, output_token_logprobs).
"""

from __future__ import annotations

import asyncio
import uuid

from aiohttp import web

from areal.chat.http import reply, request_error_reply
from areal.chat.request import RequestError, Sampling, parse_chat_request, parse_completion_request
from areal.chat.response import (
    Generation,
    chat_chunks,
    chat_response,
    completion_chunks,
    completion_response,
    new_id,
    parse_generation,
)
from areal.chat.template import encode_text, render_chat
from areal.server.bodies import read_json
from areal.server.routes_generate import GenerateRoutes, refused
from areal.server.state import Routes, ServerState
from areal.server.validation import BadRequest, _check_length, parse_sampling


class OpenAIRoutes(Routes):
    """The /v1 routes; `generation` admits, runs and formats each choice as /generate does. A
    full server is /generate's 503 (routes_generate.ServerFull, answered by app.py)."""

    def __init__(self, state: ServerState, generation: GenerateRoutes):
        super().__init__(state)
        self.generation = generation

    async def models(self, request: web.Request) -> web.Response:
        path = self.s.args.model_path
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": path,
                        "object": "model",
                        "created": int(self.s.started),
                        "owned_by": "areal",
                        "root": path,
                        "max_model_len": self.s.context_length,
                    }
                ],
            }
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        try:
            req = parse_chat_request(body)
            tok = self._tokenizer("/v1/chat/completions")
            prompt_ids = encode_text(
                tok, render_chat(tok, req.messages, tools=req.tools, template_kwargs=req.template_kwargs)
            )
            gens = await self._generate_all(prompt_ids, req.sampling, req.n, req.extensions.rid)
        except RequestError as exc:
            return request_error_reply(exc)
        replies = [parse_generation(req, g) for g in gens]
        resp = chat_response(
            req, gens, replies, prompt_ids=prompt_ids, weight_version=self.s.weight_version, rid=new_id("chatcmpl")
        )
        return await reply(request, resp, chat_chunks(resp, req.include_usage) if req.stream else None)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        try:
            req = parse_completion_request(body)
            tok = self._tokenizer("/v1/completions")
            prompt_ids = encode_text(tok, req.prompt) if isinstance(req.prompt, str) else req.prompt
            bad = [t for t in prompt_ids if t >= self.s.runner.vocab_size]
            if bad:
                raise RequestError(
                    f"/v1/completions: 'prompt' has token ids outside [0, {self.s.runner.vocab_size}): {bad[:5]}.",
                    param="prompt",
                )
            gens = await self._generate_all(prompt_ids, req.sampling, req.n, req.extensions.rid)
        except RequestError as exc:
            return request_error_reply(exc)
        resp = completion_response(
            req, gens, prompt_ids=prompt_ids, weight_version=self.s.weight_version, rid=new_id("cmpl")
        )
        return await reply(request, resp, completion_chunks(resp, req.include_usage) if req.stream else None)

    def _tokenizer(self, where: str):
        if self.s.tokenizer is None:
            raise RequestError(
                f"{where} needs a tokenizer, but the server runs with "
                "--skip-tokenizer-init; use /generate with input_ids."
            )
        return self.s.tokenizer

    async def _generate_all(
        self, prompt_ids: list[int], sampling: Sampling, n: int, rid: str | None
    ) -> list[Generation]:
        params = self._sampling_params(len(prompt_ids), sampling)
        base = rid or uuid.uuid4().hex
        rids = [base] if n == 1 else [f"{base}-{i}" for i in range(n)]
        for r in rids:
            if r in self.s.inflight:
                raise RequestError(f"rid {r!r} is already in flight; rids must be unique.", param="rid")
        seqs = await asyncio.gather(*(self._generate(r, prompt_ids, params) for r in rids))
        return [self._generation(seq) for seq in seqs]

    def _sampling_params(self, n_prompt: int, s: Sampling):
        """SGLang's sampling_params for the request, validated by /generate's own rules."""
        room = self.s.context_length - n_prompt - 1
        if room < 1:
            raise RequestError(
                f"the prompt has {n_prompt} tokens, which leaves no room in the "
                f"model's context of {self.s.context_length} tokens; shorten the "
                "conversation or raise --context-length.",
                code="context_length_exceeded",
            )
        budget = self.s.scheduler.max_total_tokens
        default = room if budget is None else max(1, min(room, budget - n_prompt))
        raw = {
            "max_new_tokens": default if s.max_tokens is None else s.max_tokens,
            "min_new_tokens": s.min_tokens,
            "stop": list(s.stop) or None,
            "stop_token_ids": list(s.stop_token_ids) or None,
            "ignore_eos": s.ignore_eos,
            "skip_special_tokens": s.skip_special_tokens,
            "no_stop_trim": s.no_stop_trim,
        }
        for key in ("temperature", "top_p", "top_k"):
            if getattr(s, key) is not None:
                raw[key] = getattr(s, key)
        try:
            params = parse_sampling(raw, self.s.runner.vocab_size)
            _check_length(n_prompt, params.max_new_tokens, self.s.context_length)
        except BadRequest as exc:
            raise RequestError(
                str(exc), code="context_length_exceeded" if "context length" in str(exc) else None
            ) from None
        return params

    async def _generate(self, rid: str, input_ids: list[int], params):
        """One sequence, admitted as /generate admits a request."""
        generation = self.generation
        try:
            generation.check_fits(len(input_ids) + params.max_new_tokens)
        except BadRequest as exc:
            raise RequestError(str(exc)) from None
        async with generation.admitted():  # held while generation is paused, like /generate
            seq = await generation.run(rid, input_ids, params, True)
        if refused(seq):
            raise RequestError(seq.finish_reason["message"], status=seq.finish_reason["status_code"])
        return seq

    def _generation(self, seq) -> Generation:
        return Generation(
            output_ids=list(seq.output_ids),
            text=self.generation.text(seq),
            finish_reason=seq.finish_reason["type"],
            logprobs=list(seq.output_logprobs),
            token_texts=[self.generation.token_text(t) or "" for t in seq.output_ids],
            matched_stop=seq.finish_reason.get("matched"),
            meta_info=self.generation.output(seq, False)["meta_info"],
        )
