"""GSM8K answer extraction and the GSM8K reward.

A reward function in this project has one signature, so workflows can call any of them the same
way and users can plug in their own by import path:

    fn(prompt: str, completion: str, prompt_ids: list[int], completion_ids: list[int],
       **sample_fields) -> float

`sample_fields` are the dataset record's fields (for GSM8K: question, answer, solution).

Extraction takes, in order of trust: the last `\\boxed{...}`, the last `#### N` (GSM8K's own
format), then the last number in the text. Comparison is numeric: an exact
comparison of rational numbers first (integers, decimals, `a/b`, `\\frac{a}{b}`); when that says
no and `math_verify` is installed, it decides (it knows LaTeX such as `\\sqrt{4}`, and rounding).
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal
from fractions import Fraction

# An unsigned number: thousands groups ("1,234") or plain digits, an optional decimal part.
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
# A sign counts only when it is not a binary minus ("5-3" is not "-3"); "$" may sit either side
# of it ("-$5", "$-5"); an optional "/ denominator" makes a fraction ("3/4").
_NUMBER_RE = re.compile(
    rf"(?:(?<![\w)\]])[-\u2212]\s?)?\$?\s?(?:(?<![\w)\]])[-\u2212])?(?:{_UNSIGNED})"
    rf"(?:\s?/\s?(?:{_UNSIGNED}))?"
)
_HASH_RE = re.compile(r"####\s*([^\n]*)")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
# LaTeX inside a box that does not change the number: units as text, escaped $ and %, spacing.
_BOX_NOISE_RE = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{[^{}]*\}|\\[$%,!;: ]|\\left|\\right")


def _last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), with nested braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i]
    return None  # unbalanced: the model stopped mid-answer


def normalize_number(text: str) -> str | None:
    """Canonical string of the last number in `text`, or None when it holds no number.

    Drops "$", thousands commas and a trailing "."; writes integral values without a decimal
    part ("18.00" -> "18") so that equal answers are equal strings; keeps fractions as "a/b".
    """
    text = _FRAC_RE.sub(r"\1/\2", text)
    matches = _NUMBER_RE.findall(text)
    if not matches:
        return None
    raw = re.sub(r"[\s$,]", "", matches[-1]).replace("\u2212", "-")
    value = _to_fraction(raw)
    if value is None:
        return None
    if value.denominator == 1:
        return str(value.numerator)
    if "/" in raw:
        return f"{value.numerator}/{value.denominator}"
    return str(Decimal(raw).normalize())  # "2.50" -> "2.5", ".5" -> "0.5"


def _to_fraction(raw: str) -> Fraction | None:
    """Exact value of a cleaned number string ("-3", "2.5", "3/4"); None if not a number."""
    try:
        return Fraction(raw)
    except (ValueError, ZeroDivisionError):
        return None


def extract_hash_answer(answer: str) -> str | None:
    """The number after GSM8K's `#### ` marker (the last one), normalized; None if absent."""
    found = _HASH_RE.findall(answer)
    return normalize_number(found[-1]) if found else None


def _boxed_number(content: str) -> str | None:
    """The number in a box, or None when the box holds more than one number with units.

    `\\boxed{18 \\text{ dollars}}` and `\\boxed{x = 3/4}` are numbers; `\\boxed{\\sqrt{4}}` and
    `\\boxed{2^2}` are expressions (not 4, not 2), left to math_verify.
    """
    plain = _FRAC_RE.sub(r"\1/\2", _BOX_NOISE_RE.sub(" ", content)).split("=")[-1]
    core = re.sub(r"[A-Za-z%\s]", "", plain)
    if "\\" in plain or not _NUMBER_RE.fullmatch(core):
        return None
    return normalize_number(core)


def extract_answer(text: str) -> str | None:
    """The final answer of a model completion, as a normalized number string, or None.

    Order: last `\\boxed{}`, then last `#### N`, then the last number anywhere in the text.
    A box holding LaTeX beyond a plain number gives None (math_verify can still judge it).
    """
    boxed = _last_boxed(text)
    if boxed is not None:
        return _boxed_number(boxed)
    hashed = extract_hash_answer(text)
    if hashed is not None:
        return hashed
    return normalize_number(text)


def numbers_equal(pred: str, target: str) -> bool:
    """Exact rational comparison of two normalized number strings ("0.75" == "3/4")."""
    a, b = _to_fraction(pred), _to_fraction(target)
    return a is not None and b is not None and a == b


def _math_verify_equal(pred: str, target: str) -> bool | None:
    """math_verify's verdict on pred vs target; None when math_verify is not installed.

    math_verify's own timeouts use SIGALRM, which only works on the main thread; elsewhere they
    are turned off (RewardRunner bounds the time from outside).
    """
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    on_main = threading.current_thread() is threading.main_thread()
    timeout = 5 if on_main else None
    gold = parse(target, parsing_timeout=timeout)
    answer = parse(pred, parsing_timeout=timeout)
    return bool(verify(gold, answer, timeout_seconds=timeout))


def reference_solution(fields: dict) -> str:
    """The reference number of a sample: its `solution`, else the `#### N` of its `answer`."""
    if fields.get("solution") not in (None, ""):
        solution = normalize_number(str(fields["solution"]))
        if solution is not None:
            return solution
    if fields.get("answer"):
        solution = extract_hash_answer(str(fields["answer"]))
        if solution is not None:
            return solution
    raise ValueError(
        "gsm8k_reward needs a reference answer: give each sample a numeric 'solution' field or an "
        f"'answer' ending in '#### N'; got fields {sorted(fields)}"
    )


def gsm8k_reward(prompt: str, completion: str, prompt_ids=None, completion_ids=None, **data) -> float:
    """1.0 when the completion's final answer equals the sample's reference number, else 0.0."""
    target = reference_solution(data)
    boxed = _last_boxed(completion)
    pred = extract_answer(completion)
    if pred is not None and numbers_equal(pred, target):
        return 1.0
    if boxed is None and pred is None:
        return 0.0
    # math_verify sees the boxed LaTeX itself (\sqrt{4}, 2^2), else the extracted number.
    verdict = _math_verify_equal(f"\\boxed{{{boxed}}}" if boxed is not None else pred, target)
    return 1.0 if verdict else 0.0
