"""The built-in server's OpenAI routes with the real `openai` client: the chat template and
tool-call round trip, a malformed call as raw content, logprobs and token ids equal to /generate's,
streaming as SSE chunks, completions, and 400s that name what is wrong."""

import json

import openai
import pytest
import requests

from areal.chat.template import encode_text, render_chat
from tests.scripted_chat import (
    ADD,
    ANSWER_TEXT,
    BAD,
    CALL_TEXT,
    END,
    HELLO,
    HELLO_TEXT,
    MALFORMED_TEXT,
    TOOLS,
    tool_result,
)
from tests.serving import start_server


@pytest.fixture(scope="module")
def server(scripted_chat_model_dir):
    handle = start_server(scripted_chat_model_dir, extra_args=["--dtype", "float32"], env={"OMP_NUM_THREADS": "1"})
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tok(scripted_chat_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(scripted_chat_model_dir)


def chat(client, messages, **kw):
    return client.chat.completions.create(model="policy", messages=messages, temperature=0, **kw)


def test_tool_call_round_trip(client, tok):
    first = chat(client, ADD, tools=TOOLS, extra_body={"return_token_ids": True})
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "calculator" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"expression": "3+4"}
    assert choice.message.content == ""
    # the prompt is the chat template's rendering of messages and tools; the reply's exact tokens
    assert choice.prompt_token_ids == encode_text(tok, render_chat(tok, ADD, tools=TOOLS))
    assert choice.response_token_ids == encode_text(tok, CALL_TEXT + END)
    # the agent sends the reply back as the client gives it, with the tool's result
    history = ADD + [choice.message.model_dump(exclude_none=True), tool_result(call.id)]
    second = chat(client, history, tools=TOOLS)
    assert second.choices[0].message.content == ANSWER_TEXT
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.tool_calls is None
    assert second.usage.prompt_tokens == len(encode_text(tok, render_chat(tok, history, tools=TOOLS)))


def test_malformed_tool_call_is_raw_text_in_content(client):
    choice = chat(client, BAD, tools=TOOLS).choices[0]
    assert choice.message.content == MALFORMED_TEXT
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"


def test_without_tools_nothing_is_parsed(client):
    choice = chat(client, HELLO).choices[0]
    assert choice.message.content == HELLO_TEXT and choice.finish_reason == "stop"


def test_logprobs_and_meta_info_equal_generate(client, server, tok):
    resp = chat(
        client, ADD, tools=TOOLS, logprobs=True, extra_body={"return_token_ids": True, "return_meta_info": True}
    )
    choice = resp.choices[0]
    direct = requests.post(
        server.url + "/generate",
        json={
            "input_ids": choice.prompt_token_ids,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 256, "temperature": 0},
        },
        timeout=60,
    ).json()
    assert direct["output_ids"] == choice.response_token_ids
    lps = [t.logprob for t in choice.logprobs.content]
    assert lps == pytest.approx([lp for lp, _, _ in direct["meta_info"]["output_token_logprobs"]], abs=1e-5)
    assert [t.token for t in choice.logprobs.content] == [tok.decode([t]) for t in choice.response_token_ids]
    meta = choice.meta_info
    assert meta["weight_version"] == resp.metadata["weight_version"]
    assert meta["output_version_spans"] == [[0, meta["weight_version"]]]
    assert meta["completion_tokens"] == len(choice.response_token_ids) == resp.usage.completion_tokens


def test_n_choices(client):
    resp = chat(client, HELLO, n=2)
    assert [c.index for c in resp.choices] == [0, 1]
    assert {c.message.content for c in resp.choices} == {HELLO_TEXT}  # greedy: the same twice
    assert resp.usage.completion_tokens == 2 * len(HELLO_TEXT + "x")  # characters + end of turn


def test_stream_sends_openai_chunks_then_done(client, server):
    stream = chat(client, ADD, tools=TOOLS, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
        (0, "calculator", {"expression": "3+4"})
    ]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    raw = requests.post(
        server.url + "/v1/chat/completions",
        json={"model": "m", "messages": HELLO, "stream": True, "temperature": 0},
        timeout=60,
    )
    assert raw.headers["Content-Type"].startswith("text/event-stream")
    events = [line for line in raw.text.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == HELLO_TEXT


def test_completions(client, tok):
    prompt = render_chat(tok, HELLO)
    resp = client.completions.create(model="policy", prompt=prompt, max_tokens=32, temperature=0, logprobs=0)
    choice = resp.choices[0]
    assert choice.text == HELLO_TEXT and choice.finish_reason == "stop"
    assert len(choice.logprobs.token_logprobs) == len(HELLO_TEXT) + 1  # the end-of-turn token too
    by_ids = client.completions.create(
        model="policy",
        prompt=encode_text(tok, prompt),
        max_tokens=32,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert by_ids.choices[0].text == HELLO_TEXT and by_ids.choices[0].token_ids == encode_text(tok, HELLO_TEXT + END)
    assert resp.usage.prompt_tokens == len(encode_text(tok, prompt))


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"extra_body": {"bogus_field": 1}}, "bogus_field"),
        ({"top_logprobs": 2, "logprobs": True}, "top_logprobs"),
        ({"tool_choice": "required", "tools": TOOLS}, "tool_choice"),
        ({"seed": 7}, "seed"),
        ({"stream": True, "extra_body": {"return_token_ids": True}}, "return_token_ids"),
        ({"max_tokens": 10, "max_completion_tokens": 11}, "max_completion_tokens"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(client, extra, named):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, HELLO, **extra)
    assert named in str(err.value)
    assert err.value.body["param"] == named


def test_bad_messages_are_400s(client):
    with pytest.raises(openai.BadRequestError, match="role"):
        chat(client, [{"role": "wizard", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="only text parts"):
        chat(client, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_a_prompt_past_the_context_is_a_400_with_openais_code(client):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, [{"role": "user", "content": "x" * 5000}])
    assert err.value.code == "context_length_exceeded"


def test_models_lists_the_served_model(client, scripted_chat_model_dir):
    assert [m.id for m in client.models.list()] == [scripted_chat_model_dir]
