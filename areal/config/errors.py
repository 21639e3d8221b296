"""Config problems as data: every problem names the key, the value, the rule and the fix."""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigIssue:
    key: str
    value: object
    rule: str
    fix: str

    def format(self) -> str:
        return f"  {self.key} = {self.value!r}: {self.rule}\n      fix: {self.fix}"


class ConfigError(ValueError):
    """Raised with every problem found in one pass; the CLI prints them and exits with 2."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = list(issues)
        super().__init__(self.format())

    def format(self) -> str:
        n = len(self.issues)
        head = f"invalid config: {n} problem{'s' if n != 1 else ''}"
        return "\n".join([head, *(i.format() for i in self.issues)])


def closest_key(name: str, candidates) -> str | None:
    """The valid key a misspelt one most likely meant, or None when nothing is close."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return match[0] if match else None
