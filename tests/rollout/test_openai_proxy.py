"""The rollout proxy with the real `openai` client, against a built-in server through
RemoteSGLangEngine: the recorded tokens and logprobs are the server's, follow-up prompts extend
the previous call exactly, versions follow a weight update that lands mid-episode (between calls
and during one), a malformed tool call reaches the agent as raw content, and the proxy's 4xx."""

import asyncio
import concurrent.futures
import json
import logging

import openai
import pytest
import requests

from areal.api.weights import WeightUpdateMeta
from areal.chat.template import encode_text, render_chat
from areal.config.rollout import GenerationConfig
from areal.engine.sglang.client import RemoteSGLangEngine
from areal.rollout.openai_proxy import OpenAIProxy
from areal.workflow.agent import conversation_row
from tests.scripted_chat import ADD, ANSWER_TEXT, BAD, CALL_TEXT, END, HELLO, MALFORMED_TEXT, TOOLS, tool_result
from tests.serving import pause_mid_generation, start_server

GREEDY = GenerationConfig(n_samples=1, max_new_tokens=256, temperature=0.0)


@pytest.fixture(scope="module")
def server(scripted_chat_model_dir):
    handle = start_server(scripted_chat_model_dir, extra_args=["--dtype", "float32"], env={"OMP_NUM_THREADS": "1"})
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def engine(server, scripted_chat_model_dir):
    eng = RemoteSGLangEngine.from_pretrained(
        scripted_chat_model_dir, server_addrs=[server.url], rollout={"consumer_batch_size": 2}
    )
    yield eng
    eng.destroy()


@pytest.fixture(scope="module")
def tok(scripted_chat_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(scripted_chat_model_dir)


def run_agent(engine, tok, agent, **proxy_kw):
    """Run `agent(client)` as one episode on a fresh proxy; (its result, the recorded calls)."""

    async def main():
        proxy = OpenAIProxy(engine, tok, proxy_kw.pop("gconfig", GREEDY), **proxy_kw)
        await proxy.start()
        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="none", max_retries=0)
        try:
            episode = proxy.open_episode()
            try:
                return await agent(client.with_options(api_key=episode.key)), episode.calls
            finally:
                proxy.close_episode(episode)
        finally:
            await client.close()
            await proxy.stop()

    return asyncio.run(main())


async def tool_agent(client, between=None, **kw):
    """Call, run the calculator call it asks for, call again; `between` runs in between."""
    first = await client.chat.completions.create(model="m", messages=ADD, tools=TOOLS, **kw)
    message = first.choices[0].message
    if between is not None:
        await between()
    history = ADD + [message.model_dump(exclude_none=True), tool_result(message.tool_calls[0].id)]
    second = await client.chat.completions.create(model="m", messages=history, tools=TOOLS, **kw)
    return first, second


def test_recorded_tokens_and_logprobs_are_the_servers(engine, server, tok):
    (first, second), calls = run_agent(
        engine, tok, lambda c: tool_agent(c, logprobs=True, extra_body={"return_token_ids": True})
    )
    assert first.choices[0].finish_reason == "tool_calls" and second.choices[0].message.content == ANSWER_TEXT
    assert len(calls) == 2
    a, b = calls
    assert a.prompt_ids == encode_text(tok, render_chat(tok, ADD, tools=TOOLS)) and a.parent is None
    assert a.output_ids == encode_text(tok, CALL_TEXT + END) and a.tool_calls == 1
    # the follow-up is built on the first call's exact tokens
    assert b.parent == 0 and b.prompt_ids[: len(a.sequence)] == a.sequence
    for call, resp in ((a, first), (b, second)):
        choice = resp.choices[0]
        assert (choice.prompt_token_ids, choice.response_token_ids) == (call.prompt_ids, call.output_ids)
        assert [t.logprob for t in choice.logprobs.content] == call.logprobs
        direct = requests.post(
            server.url + "/generate",
            json={
                "input_ids": call.prompt_ids,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 256, "temperature": 0},
            },
            timeout=60,
        ).json()
        assert direct["output_ids"] == call.output_ids
        assert call.logprobs == pytest.approx(
            [lp for lp, _, _ in direct["meta_info"]["output_token_logprobs"]], abs=1e-5
        )


def test_versions_follow_a_weight_update_between_calls(engine, tok, scripted_chat_model_dir):
    version = engine.get_version()

    async def update():
        await asyncio.to_thread(
            engine.control.update_weights, WeightUpdateMeta("disk", path=scripted_chat_model_dir, version=version + 1)
        )

    (first, second), (a, b) = run_agent(
        engine, tok, lambda c: tool_agent(c, between=update, extra_body={"return_meta_info": True})
    )
    assert set(a.versions) == {version} and set(b.versions) == {version + 1}
    assert first.choices[0].meta_info["output_version_spans"] == [[0, str(version)]]
    assert second.choices[0].meta_info["weight_version"] == str(version + 1)
    assert second.metadata["weight_version"] == str(version + 1)
    row, trained = conversation_row([a, b], pad_id=0)
    generated = [v for v, m in zip(row["versions"], row["loss_mask"]) if m]
    assert trained == 2 and generated == a.versions + b.versions
    assert all(v == -1 for v, m in zip(row["versions"], row["loss_mask"]) if not m)  # prompts, tool result


def test_versions_follow_a_weight_update_during_a_call(engine, server, tok, scripted_chat_model_dir):
    """The update lands while the call is generating: its tokens carry both versions, in order,
    and the output is still the script's (the same weights were reloaded)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    agent = lambda c: c.chat.completions.create(model="m", messages=ADD, tools=TOOLS)  # noqa: E731
    futures, _ = pause_mid_generation(server.url, lambda: [pool.submit(run_agent, engine, tok, agent)], mode="retract")
    version = engine.get_version()
    engine.control.update_weights(WeightUpdateMeta("disk", path=scripted_chat_model_dir, version=version + 1))
    requests.post(server.url + "/continue_generation", json={}, timeout=60)
    resp, (call,) = futures[0].result(timeout=120)
    pool.shutdown()
    assert call.output_ids == encode_text(tok, CALL_TEXT + END)
    k = call.versions.index(version + 1)
    assert 0 < k and call.versions == [version] * k + [version + 1] * (len(call.versions) - k)
    assert resp.choices[0].finish_reason == "tool_calls"


def test_malformed_tool_call_reaches_the_agent_as_content(engine, tok):
    async def agent(client):
        first = await client.chat.completions.create(model="m", messages=BAD, tools=TOOLS)
        message = first.choices[0].message
        retry = BAD + [message.model_dump(exclude_none=True), {"role": "user", "content": "try again"}]
        await client.chat.completions.create(model="m", messages=retry, tools=TOOLS, max_tokens=8)
        return message

    message, (a, b) = run_agent(engine, tok, agent)
    assert message.content == MALFORMED_TEXT and message.tool_calls is None
    assert a.malformed and "invalid JSON" in a.malformed and a.tool_calls == 0 and a.finish_reason == "stop"
    assert b.parent == 0  # the raw text went back as content and still matched the reply
    assert len(b.output_ids) <= 8  # max_tokens lowers the run's budget


def test_streaming_through_the_proxy(engine, tok):
    async def agent(client):
        stream = await client.chat.completions.create(model="m", messages=ADD, tools=TOOLS, stream=True)
        return [chunk async for chunk in stream]

    chunks, (call,) = run_agent(engine, tok, agent)
    calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    assert [json.loads(tc.function.arguments) for tc in calls] == [{"expression": "3+4"}]
    assert call.output_ids == encode_text(tok, CALL_TEXT + END)


def test_run_sampling_wins_over_the_request(engine, tok, caplog):
    caplog.set_level(logging.WARNING, logger="areal.rollout.openai_proxy")

    async def agent(client):
        return await client.chat.completions.create(model="m", messages=ADD, tools=TOOLS, temperature=1.5)

    resp, _ = run_agent(engine, tok, agent)
    assert resp.choices[0].finish_reason == "tool_calls"  # still greedy, as gconfig says
    assert "temperature=1.5" in caplog.text and "gconfig.temperature=0.0" in caplog.text


def test_proxy_errors(engine, tok):
    async def agent(client):
        errors = {}
        await client.chat.completions.create(model="m", messages=HELLO)
        for name, call in (
            ("limit", client.chat.completions.create(model="m", messages=HELLO)),
            ("field", client.chat.completions.create(model="m", messages=HELLO, extra_body={"n_best": 2})),
            ("key", client.with_options(api_key="not-an-episode").chat.completions.create(model="m", messages=HELLO)),
        ):
            try:
                await call
            except openai.APIStatusError as exc:
                errors[name] = exc
        return errors

    errors, calls = run_agent(engine, tok, agent, max_calls=1)
    assert len(calls) == 1
    assert isinstance(errors["limit"], openai.RateLimitError) and "workflow.agent.max_calls" in str(errors["limit"])
    assert isinstance(errors["field"], openai.BadRequestError) and "n_best" in str(errors["field"])
    assert isinstance(errors["key"], openai.AuthenticationError)


def test_context_length_is_a_400_with_openais_code(engine, tok):
    async def agent(client):
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model="m", messages=ADD, tools=TOOLS)
        return err.value

    error, calls = run_agent(engine, tok, agent, context_length=64)
    assert error.code == "context_length_exceeded" and calls == []
