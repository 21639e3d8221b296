"""A calculator-tool agent on the word problems, written against the OpenAI API and trained as it
is (workflow.type=agent; docs/customization.md walks through it):

    workflow:
      type: agent
      agent:
        run: examples.calculator_agent:run

    areal-launch --config calculator_agent_cpu.yaml            # CPU smoke run, tiny model
    areal-launch --config smollm2_calculator_agent_1gpu.yaml   # SmolLM2-135M-Instruct, one GPU

The same function runs against any OpenAI-compatible endpoint, which is the point:

    python -m examples.calculator_agent --base-url http://127.0.0.1:30000/v1   # a built-in server

The agent offers one tool, `calculator`, shows the model two solved problems as conversations
with calculator calls (few-shot: SmolLM2-135M-Instruct wrote no tool call in 24 tries with the
tool described alone, and about one reply in two with these examples and the CUE), lets it call
the tool for up to MAX_TURNS replies, and scores the final reply's last number against the
record's `solution`. Reward: 1 for the right answer, plus TOOL_BONUS once the model has made a
calculator call that evaluated (a small format reward). Figures logged per step:
rollout/agent/accuracy (right answers), and the workflow's own rollout/agent/tool_call_rate.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import operator

from areal.reward.gsm8k import extract_answer, numbers_equal, reference_solution

MAX_TURNS = 3
TOOL_BONUS = 0.1
SYSTEM = (
    "You solve arithmetic word problems. Use the calculator tool for every computation, "
    "then reply with the final answer as a number."
)
CUE = "\nUse the calculator."
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def solved(question: str, expression: str, answer: str, call_id: str) -> list[dict]:
    """A worked example as the conversation the agent would have had."""
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
    }
    return [
        {"role": "user", "content": question + CUE},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": answer},
        {"role": "assistant", "content": answer},
    ]


EXAMPLES = solved(
    "Sam has 4 cards. He buys 5 more. How many cards does Sam have now?", "4 + 5", "9", "call_ex1"
) + solved(
    "Ava had 12 shells and gave 7 of them to a friend. How many shells does Ava have left?", "12 - 7", "5", "call_ex2"
)


async def run(client, data: dict) -> dict:
    """One episode: the conversation, the tool calls it asks for, and the score."""
    messages = [{"role": "system", "content": SYSTEM}, *EXAMPLES, {"role": "user", "content": data["question"] + CUE}]
    used_tool = False
    reply = None
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        reply = response.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            result = call_calculator(call.function.name, call.function.arguments)
            used_tool |= not result.startswith("error")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    correct = is_correct(reply.content if reply is not None else "", data)
    return {"reward": float(correct) + (TOOL_BONUS if used_tool else 0.0), "accuracy": float(correct)}


def is_correct(text: str | None, data: dict) -> bool:
    pred = extract_answer(text or "")
    return pred is not None and numbers_equal(pred, reference_solution(data))


def call_calculator(name: str, arguments: str) -> str:
    """The tool's answer as text; a bad call gets an error message, as a real tool would give."""
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        expression = json.loads(arguments)["expression"]
        value = evaluate(str(expression))
    except (ValueError, KeyError, TypeError, ZeroDivisionError, SyntaxError) as exc:
        return f"error: {type(exc).__name__}: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expression: str) -> float:
    """+ - * / and parentheses on numbers; anything else is a ValueError (no eval of user text)."""
    if len(expression) > 200:
        raise ValueError("expression too long")

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        raise ValueError(f"not arithmetic: {ast.dump(node)[:80]}")

    return value(ast.parse(expression, mode="eval").body)


def main(argv: list[str] | None = None) -> None:
    """Run the agent on a few word problems against an OpenAI-compatible endpoint."""
    import openai

    from areal.dataset.word_problems import make_word_problems

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", default="none")
    p.add_argument("-n", type=int, default=4)
    args = p.parse_args(argv)

    async def go():
        client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key)
        for record in make_word_problems(args.n, seed=0):
            print(json.dumps({"question": record["question"], **await run(client, record)}))

    asyncio.run(go())


if __name__ == "__main__":
    main()
