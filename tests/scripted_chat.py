"""A tiny chat model that follows scripts: trained (in seconds, on CPU) to answer a few
conversations with exact replies, so the OpenAI-API tests see real tool calls, a malformed one
and a final answer come out of a real server's greedy decoding.

The model is the `tiny:chat` architecture (characters, ChatML with tools); its replies are fitted
until greedy decoding gives every scripted reply with a clear margin, and the fixture fails with a
message if that does not happen. The prompts are built exactly as the server (fresh renders) and
the rollout proxy (follow-ups on the previous call's tokens) build them.
"""

from __future__ import annotations

import json
from pathlib import Path

from areal.chat.continuation import continuation_text
from areal.chat.template import encode_text, render_chat

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
TOOLS = [CALCULATOR]
SYSTEM = {"role": "system", "content": "You may use tools."}
ADD = [SYSTEM, {"role": "user", "content": "add 3 and 4"}]
BAD = [SYSTEM, {"role": "user", "content": "bad call"}]
HELLO = [{"role": "user", "content": "hello"}]
END = "<|im_end|>"
CALL_TEXT = '<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call>'
MALFORMED_TEXT = '<tool_call>{"name": "calculator", "arguments": {"expression": 3+}}</tool_call>'
ANSWER_TEXT = "The answer is 7."
HELLO_TEXT = "Hi there."


def assistant_call(call_id: str = "call_1") -> dict:
    """The assistant message of ADD's first reply, as the openai client sends it back."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": "3+4"})},
            }
        ],
    }


def tool_result(call_id: str = "call_1") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "7"}


def scripts(tok) -> list[tuple[list[int], str]]:
    """(prompt ids, reply text) pairs the model must answer exactly (then end its turn)."""
    add_1 = encode_text(tok, render_chat(tok, ADD, tools=TOOLS))
    call_ids = encode_text(tok, CALL_TEXT + END)
    follow = [tool_result()]
    spliced = (
        add_1 + call_ids + encode_text(tok, continuation_text(tok, ADD, follow, ended_with=END, tools=TOOLS))
    )  # the proxy's follow-up prompt
    fresh = encode_text(tok, render_chat(tok, ADD + [assistant_call()] + follow, tools=TOOLS))  # the server's
    return [
        (add_1, CALL_TEXT),
        (spliced, ANSWER_TEXT),
        (fresh, ANSWER_TEXT),
        (encode_text(tok, render_chat(tok, BAD, tools=TOOLS)), MALFORMED_TEXT),
        (encode_text(tok, render_chat(tok, HELLO)), HELLO_TEXT),
    ]


def build_scripted_chat_model(path, *, steps: int = 1500, margin: float = 3.0) -> Path:
    """Fit the tiny chat model to the scripts and save it to `path` (idempotent)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal.models.resolve import TINY_PRESETS
    from areal.models.tiny import make_tiny_model_dir

    path = Path(path)
    if (path / "scripted.ok").exists():
        return path
    make_tiny_model_dir(path, seed=0, **TINY_PRESETS["chat"])
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    pairs = [(p, encode_text(tok, text + END)) for p, text in scripts(tok)]
    width = max(len(p) + len(t) for p, t in pairs)
    ids = torch.zeros(len(pairs), width, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    mask = torch.zeros(len(pairs), width, dtype=torch.long)
    for i, (p, t) in enumerate(pairs):
        seq = p + t
        ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
        labels[i, len(p) : len(seq)] = torch.tensor(t)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(steps):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        if step % 50 == 49 and _fitted(out.logits.detach(), labels, margin):
            break
    else:
        raise AssertionError(
            f"the scripted chat model did not fit its scripts in {steps} steps (loss {float(out.loss):.4f})"
        )
    model.save_pretrained(path)
    (path / "scripted.ok").write_text("")
    return path


def _fitted(logits, labels, margin: float) -> bool:
    """Every scripted token is the argmax, ahead of the runner-up by `margin` logits."""
    pred_logits, targets = logits[:, :-1], labels[:, 1:]
    keep = targets != -100
    top2 = pred_logits.topk(2, dim=-1)
    chosen = pred_logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    ok = (top2.indices[..., 0] == targets) & (chosen - top2.values[..., 1] >= margin)
    return bool(ok[keep].all())
