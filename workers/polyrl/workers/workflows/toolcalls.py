"""Tool calls in a policy's replies, and the tools that answer them.

The format is the one ChatML models are trained on (Hermes, Qwen2.5, Qwen3 templates): a
JSON object with `name` and `arguments` between `<tool_call>` and `</tool_call>`,

    <tool_call>{"name": "calculate", "arguments": {"expression": "12+7"}}</tool_call>

and the answer goes back as a message of role `tool` whose content is the tool's JSON output
(or "error: ..."). It is also the fallback for templates that define no tool-call format
(SmolLM2's, the tiny test models'): such a policy learns it from its warm-up transcripts.
Other formats (Llama 3.1's bare JSON, Mistral's `[TOOL_CALLS]`) are not parsed.

A malformed call is the policy's mistake, not a failure: the tool message says what was
wrong and the episode goes on (a policy that writes broken calls is rewarded for what it
reaches). A tool that fails (`sandbox.ToolFailed`) ends the episode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polyrl.workers.workflows import sandbox

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Malformed:
    """A `<tool_call>` whose body is not a call: what the policy is told."""

    why: str


def parse(text: str) -> list[ToolCall | Malformed]:
    """The tool calls in `text`, in order (an unclosed last one included: a reply cut short)."""
    calls: list[ToolCall | Malformed] = []
    for body in _CALL.findall(text):
        try:
            value = json.loads(body)
        except json.JSONDecodeError as err:
            calls.append(Malformed(f"the tool call is not JSON ({err.msg})"))
            continue
        name = value.get("name") if isinstance(value, dict) else None
        arguments = value.get("arguments", {}) if isinstance(value, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            calls.append(Malformed('a tool call is {"name": "...", "arguments": {...}}'))
            continue
        calls.append(ToolCall(name, arguments))
    return calls


def format_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A call as a policy writes it (for warm-up transcripts)."""
    body = json.dumps({"name": name, "arguments": dict(arguments)}, separators=(",", ":"))
    return f"{OPEN}{body}{CLOSE}"


def message(content: str) -> dict[str, str]:
    """A tool's answer as the policy is shown it."""
    return {"role": "tool", "content": content}


@dataclass
class Tools:
    """The tools a policy may call, by name (`module:function` each), run in the sandbox."""

    functions: Mapping[str, str]
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    path: list[str] | None = None
    """Where the tools are imported from (None: where this process imports from)."""
    calls: int = 0
    """Calls a tool answered so far."""
    malformed: int = 0
    """Calls that named no tool there is, or were no call at all."""

    async def answer(self, call: ToolCall | Malformed) -> dict[str, str]:
        """The tool message for `call`; `sandbox.ToolFailed` where the tool fails."""
        if isinstance(call, Malformed) or call.name not in self.functions:
            self.malformed += 1
        if isinstance(call, Malformed):
            return message(f"error: {call.why}")
        if call.name not in self.functions:
            return message(f"error: no tool {call.name!r} (there are {', '.join(self.functions)})")
        result = await sandbox.run_tool(
            self.functions[call.name], call.arguments, limits=self.limits, path=self.path
        )
        self.calls += 1
        return message(result.text)


__all__ = ["CLOSE", "OPEN", "Malformed", "ToolCall", "Tools", "format_call", "message", "parse"]
