"""areal/chat on its own: tool-call parsing, request validation, response chunks, and follow-up
prompts built on the previous call's text."""

import json

import pytest

from areal.chat.continuation import continuation_text, message_key, reply_key
from areal.chat.request import RequestError, parse_chat_request, parse_completion_request
from areal.chat.response import Generation, chat_chunks, chat_response, parse_generation, sse_events
from areal.chat.template import CHATML_TOOLS, render_chat
from areal.chat.tool_calls import parse_reply

TOOLS = {"calculator", "search"}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>'


def args_of(reply):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls]


# ---- tool calls ---------------------------------------------------------------------------------


def test_well_formed_calls_become_tool_calls():
    reply = parse_reply("Let me compute." + CALL, TOOLS)
    assert reply.content == "Let me compute." and reply.malformed is None
    assert args_of(reply) == [("calculator", {"expression": "1+2"})]
    call = reply.tool_calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_") and reply.finish_reason == "tool_calls"


def test_qwen_layout_several_calls_and_argument_spellings():
    text = (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "search", "parameters": {"q": "x"}}\n</tool_call>\n'
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"4\\"}"}</tool_call>'
    )
    reply = parse_reply(text, TOOLS)
    assert reply.content == ""
    assert args_of(reply) == [
        ("calculator", {"expression": "2*3"}),
        ("search", {"q": "x"}),
        ("calculator", {"expression": "4"}),
    ]
    assert len({c["id"] for c in reply.tool_calls}) == 3


def test_an_unclosed_last_block_still_parses():
    reply = parse_reply('<tool_call>{"name": "calculator", "arguments": {}}', TOOLS)
    assert args_of(reply) == [("calculator", {})]


@pytest.mark.parametrize(
    "text, why",
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": 1+}}</tool_call>', "invalid JSON"),
        ('<tool_call>{"name": "shell", "arguments": {}}</tool_call>', "unknown tool 'shell'"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
        ('<tool_call>["calculator"]</tool_call>', "not an object"),
        ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "'arguments' of 'calculator'"),
        ('<tool_call>{"name": "calculator", "arguments": {}} and then some', "invalid JSON"),
        (CALL + '<tool_call>{"name": "calculator"', "tool call 2: invalid JSON"),
    ],
)
def test_malformed_calls_come_back_whole_as_content(text, why):
    reply = parse_reply(text, TOOLS)
    assert reply.content == text and reply.tool_calls is None and why in reply.malformed
    assert reply.finish_reason is None


def test_nothing_is_parsed_without_tools_offered():
    assert parse_reply(CALL, set()).tool_calls is None and parse_reply(CALL, None).content == CALL


# ---- requests -----------------------------------------------------------------------------------


def chat_body(**kw):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}


TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {}}}


def test_chat_request_defaults_and_fields():
    req = parse_chat_request(
        chat_body(
            tools=[TOOL],
            max_completion_tokens=9,
            stop="##",
            n=2,
            seed=None,
            frequency_penalty=0,
            response_format={"type": "text"},
            user="someone",
        )
    )
    assert req.tool_choice == "auto" and req.parses_tool_calls and req.tool_names == {"calculator"}
    assert req.sampling.max_tokens == 9 and req.sampling.stop == ("##",) and req.n == 2
    assert req.sampling.temperature is None and not req.stream and not req.logprobs
    plain = parse_chat_request(chat_body(tool_choice="none", tools=[TOOL]))
    assert not plain.parses_tool_calls
    assert parse_chat_request(chat_body()).tool_choice == "none"
    dev = parse_chat_request({"messages": [{"role": "developer", "content": "be nice"}]})
    assert dev.messages[0]["role"] == "system" and dev.model == "default"


@pytest.mark.parametrize(
    "body, param",
    [
        (chat_body(temprature=0.5), "temprature"),
        (chat_body(seed=3), "seed"),
        (chat_body(presence_penalty=0.5), "presence_penalty"),
        (chat_body(top_logprobs=1), "top_logprobs"),
        (chat_body(tool_choice={"type": "function", "function": {"name": "calculator"}}, tools=[TOOL]), "tool_choice"),
        (chat_body(parallel_tool_calls=False), "parallel_tool_calls"),
        (chat_body(stream_options={"include_usage": True}), "stream_options"),
        (chat_body(stream=True, return_meta_info=True), "return_meta_info"),
        (chat_body(max_tokens=0), "max_tokens"),
        (chat_body(temperature=3), "temperature"),
        (chat_body(temperature=True), "temperature"),
        (chat_body(stop=[""]), "stop"),
        (chat_body(n=0), "n"),
        (chat_body(tools=[{"type": "function"}]), "tools"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": None}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages"),
    ],
)
def test_bad_chat_requests_name_the_field(body, param):
    with pytest.raises(RequestError) as err:
        parse_chat_request(body)
    assert err.value.param == param and err.value.status == 400


def test_history_keys_beyond_openais_reach_the_template():
    req = parse_chat_request(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
            ]
        }
    )
    assert req.messages[1]["refusal"] is None and req.messages[1]["tool_calls"][0]["function"]["name"] == "f"


def test_completion_requests():
    req = parse_completion_request({"model": "m", "prompt": ["abc"], "logprobs": 0})
    assert req.prompt == "abc" and req.logprobs and req.sampling.max_tokens == 16
    assert parse_completion_request({"prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    for body, param in (
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "a", "logprobs": 2}, "logprobs"),
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "best_of": 3}, "best_of"),
        ({"prompt": "a", "suffix": "z"}, "suffix"),
        ({"prompt": "a", "messages": []}, "messages"),
    ):
        with pytest.raises(RequestError) as err:
            parse_completion_request(body)
        assert err.value.param == param


# ---- responses ----------------------------------------------------------------------------------


def test_chat_response_and_its_stream_chunks():
    req = parse_chat_request(chat_body(tools=[TOOL], logprobs=True, return_token_ids=True))
    gen = Generation(
        output_ids=[5, 6],
        text="ok" + CALL,
        finish_reason="stop",
        logprobs=[-0.5, -0.25],
        token_texts=["o", "k"],
        meta_info={"weight_version": "3"},
    )
    reply = parse_generation(req, gen)
    body = chat_response(req, [gen], [reply], prompt_ids=[1, 2, 3], weight_version="3")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "ok"
    assert choice["prompt_token_ids"] == [1, 2, 3] and choice["response_token_ids"] == [5, 6]
    assert [t["logprob"] for t in choice["logprobs"]["content"]] == [-0.5, -0.25]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert body["metadata"] == {"weight_version": "3"} and "meta_info" not in choice
    chunks = chat_chunks(body, include_usage=True)
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[1] == {"content": "ok"}
    assert deltas[2]["tool_calls"][0]["index"] == 0 and deltas[3] == {}
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 5
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == body["id"] for c in chunks)
    events = sse_events(chunks)
    assert events[-1] == b"data: [DONE]\n\n" and json.loads(events[0][6:]) == chunks[0]


def test_length_keeps_its_finish_reason_even_with_a_parsed_call():
    req = parse_chat_request(chat_body(tools=[TOOL]))
    gen = Generation(output_ids=[1], text=CALL, finish_reason="length")
    body = chat_response(req, [gen], [parse_generation(req, gen)], prompt_ids=[1], weight_version=None)
    assert body["choices"][0]["finish_reason"] == "length"


# ---- follow-up prompts --------------------------------------------------------------------------


def template_tokenizer(template):
    from areal.models.tiny import build_char_tokenizer

    return build_char_tokenizer("".join(chr(c) for c in range(32, 127)) + "\n", chat_template=template)


HISTORY = [{"role": "user", "content": "1+2?"}]
TOOL_TURN = [{"role": "tool", "tool_call_id": "c", "content": "3"}]


def test_continuation_is_the_template_text_after_the_assistant_turn():
    tok = template_tokenizer(CHATML_TOOLS)
    after = continuation_text(tok, HISTORY, TOOL_TURN, ended_with="<|im_end|>")
    assert after == "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n"
    # a model cut off by its budget did not end its turn: the template's end of turn is kept
    assert continuation_text(tok, HISTORY, TOOL_TURN, ended_with=None).startswith("<|im_end|>\n<|im_start|>tool")
    # whatever the model wrote, prompt + its text + continuation renders like the whole chat
    reply = {"role": "assistant", "content": "It is 3."}
    whole = render_chat(tok, HISTORY + [reply] + TOOL_TURN)
    spliced = (
        render_chat(tok, HISTORY)
        + "It is 3.<|im_end|>"
        + continuation_text(tok, HISTORY, TOOL_TURN, ended_with="<|im_end|>")
    )
    assert spliced == whole


def test_a_template_that_hides_the_assistant_turn_gives_no_continuation():
    tok = template_tokenizer(
        "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}{% endfor %}"
    )
    assert continuation_text(tok, HISTORY, TOOL_TURN, ended_with=None) is None


def test_message_keys_ignore_what_clients_add():
    sent = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"b": 1,  "a": 2}'}}],
    }
    returned = [{"id": "y", "type": "function", "function": {"name": "f", "arguments": '{"a": 2, "b": 1}'}}]
    assert message_key(sent) == reply_key("", returned)
    assert message_key({"role": "user", "content": [{"type": "text", "text": "hi"}]}) == message_key(
        {"role": "user", "content": "hi"}
    )
    assert message_key({"role": "tool", "tool_call_id": "a", "content": "1"}) != message_key(
        {"role": "tool", "tool_call_id": "b", "content": "1"}
    )


def test_the_protocol_and_the_proxy_never_import_the_server():
    """The trainer never imports areal.server: what both sides share lives in areal/chat."""
    from pathlib import Path

    from tests.infra.test_import_direction import REPO, imported_modules

    files = [
        *(REPO / "areal" / "chat").glob("*.py"),
        REPO / "areal/rollout/openai_proxy.py",
        REPO / "areal/workflow/agent.py",
    ]
    offenders = {
        str(Path(p).relative_to(REPO)): sorted(m for m in imported_modules(p) if m.startswith("areal.server"))
        for p in files
    }
    assert {p: m for p, m in offenders.items() if m} == {}
