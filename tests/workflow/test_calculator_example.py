"""examples/calculator_agent.py's own logic, with a stand-in client that replies as a model
would: the tool loop, the safe calculator and the score."""

import asyncio
import json

import pytest
from openai.types.chat import ChatCompletion

from examples.calculator_agent import TOOL_BONUS, call_calculator, evaluate, run

RECORD = {
    "question": "Mia has 7 apples. She buys 5 more. How many apples does Mia have now?",
    "answer": "7 + 5 = 12\n#### 12",
    "solution": "12",
}


def completion(content, tool_calls=None):
    finish = "tool_calls" if tool_calls else "stop"
    return ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish,
                    "logprobs": None,
                    "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
                }
            ],
        }
    )


class ScriptedClient:
    """client.chat.completions.create answers from a list, and keeps what it was sent."""

    def __init__(self, replies):
        self.replies, self.sent = list(replies), []
        self.chat = self.completions = self

    async def create(self, **kwargs):
        self.sent.append(json.loads(json.dumps(kwargs["messages"])))
        return self.replies.pop(0)


def call(expression, call_id="call_1"):
    return [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
        }
    ]


def test_the_tool_loop_and_the_score():
    client = ScriptedClient([completion("", call("7 + 5")), completion("Mia has 12 apples.")])
    result = asyncio.run(run(client, RECORD))
    assert result == {"reward": 1.0 + TOOL_BONUS, "accuracy": 1.0}
    last = client.sent[-1]
    assert last[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "12"}
    assert last[-2]["tool_calls"][0]["function"]["name"] == "calculator"


def test_a_wrong_answer_without_tools_scores_zero():
    result = asyncio.run(run(ScriptedClient([completion("It is 11.")]), RECORD))
    assert result == {"reward": 0.0, "accuracy": 0.0}


def test_a_broken_call_gets_an_error_and_no_bonus():
    client = ScriptedClient([completion("", call("abs(-3)")), completion("12")])
    assert asyncio.run(run(client, RECORD)) == {"reward": 1.0, "accuracy": 1.0}
    assert client.sent[-1][-1]["content"].startswith("error: ValueError")


def test_the_calculator_is_arithmetic_only():
    assert evaluate("(2 + 3) * 4 - 6 / 3") == 18.0
    assert call_calculator("calculator", json.dumps({"expression": "7/2"})) == "3.5"
    assert call_calculator("shell", "{}").startswith("error: unknown tool")
    for bad in ("__import__('os')", "2 ** 100", "x + 1", "1 / 0"):
        assert call_calculator("calculator", json.dumps({"expression": bad})).startswith("error")
    with pytest.raises(ValueError):
        evaluate("1 + " * 100)
