"""Agents for tests/workflow/test_agent.py, named by import path as a config names them."""

from tests.scripted_chat import ADD, BAD, TOOLS, tool_result


async def calculator(client, data):
    """The tool round trip on the scripted model: a tool call, its result, the answer."""
    first = await client.chat.completions.create(model="m", messages=ADD, tools=TOOLS)
    message = first.choices[0].message
    history = ADD + [message.model_dump(exclude_none=True), tool_result(message.tool_calls[0].id)]
    second = await client.chat.completions.create(model="m", messages=history, tools=TOOLS)
    correct = "7" in second.choices[0].message.content
    return {"reward": float(correct) + data["bonus"], "accuracy": float(correct)}


async def malformed(client, data):
    """The model's tool call does not parse: the agent sees text and scores 0."""
    reply = await client.chat.completions.create(model="m", messages=BAD, tools=TOOLS)
    return 0.0 if reply.choices[0].message.tool_calls is None else 1.0


async def no_calls(client, data):
    return 0.5


async def returns_text(client, data):
    return "great"


async def fails(client, data):
    raise RuntimeError("the agent broke")


def not_async(client, data):
    return 1.0


async def waits(client, data):
    """Never ends (until its worker is killed or the episode cancelled)."""
    import asyncio

    await asyncio.Event().wait()


async def one_token(client, data):
    """One call for one token; the reward says which record the run had."""
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    return float(data["i"])


async def one_tool_call(client, data):
    """One call; the reward says which record the run had, and whether the tool call parsed."""
    reply = await client.chat.completions.create(model="m", messages=ADD, tools=TOOLS)
    return float(data["i"]) + (0.5 if reply.choices[0].message.tool_calls else 0.0)
