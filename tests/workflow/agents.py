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
