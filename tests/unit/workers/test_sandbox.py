"""Tools run in a sandboxed subprocess (`polyrl.workers.workflows.sandbox`): an answer or the
error a tool raised comes back; a hang, a crash, the memory cap, garbage, the network, files
outside the scratch directory and programs each end the call with `ToolFailed`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from polyrl.workers.workflows import sandbox

TOOLS = "tests.unit.workers.sandbox_tools"
ROOT = str(Path(__file__).resolve().parents[3])  # where `tests` is imported from


async def call(name: str, **arguments: object) -> sandbox.ToolResult:
    return await sandbox.run_tool(f"{TOOLS}:{name}", arguments, path=[ROOT])


async def test_a_tool_answers_as_json_and_an_exception_it_raises_is_its_answer_too() -> None:
    assert (await call("add", a=12, b=7)).text == "19"
    divided = await call("divide", a=1, b=0)
    assert divided.error == "ZeroDivisionError: division by zero"
    assert divided.text == "error: ZeroDivisionError: division by zero"
    assert json.loads((await call("scratch_roundtrip", text="kept")).text) == "kept"


@pytest.mark.parametrize(
    ("tool", "arguments", "why"),
    [
        ("hang", {"seconds": 30}, "no answer within 1 s"),
        ("crash", {}, "died (signal SIGABRT)"),
        ("exits", {}, "died (exit status 3)"),
        ("hog", {"megabytes": 1024}, "memory cap"),
        ("garbage", {}, "object is not JSON"),
        ("flood", {"kilobytes": 100}, "over 65536"),
        ("connect", {"port": 4222}, "no network in a tool"),
        ("run_program", {}, "may not start programs"),
        ("add", {"a": 1}, "TypeError"),
    ],
    ids=[
        "hangs",
        "crashes",
        "exits",
        "over-memory",
        "garbage",
        "too-much",
        "network",
        "program",
        "bad-arguments",
    ],
)
async def test_a_tool_that_goes_wrong_fails_the_call_saying_why(
    tool: str, arguments: dict[str, object], why: str
) -> None:
    if tool == "add":  # wrong arguments are the tool's own error: the policy reads it
        assert why in str((await call(tool, **arguments)).error)
        return
    limits = sandbox.Limits(timeout=1.0)
    with pytest.raises(sandbox.ToolFailed, match=re.escape(why)) as failed:
        await sandbox.run_tool(f"{TOOLS}:{tool}", arguments, limits=limits, path=[ROOT])
    assert failed.value.reason == "tool"


async def test_a_tool_that_cannot_be_imported_fails_the_call_naming_it() -> None:
    with pytest.raises(sandbox.ToolFailed, match="cannot be imported: AttributeError"):
        await call("no_such_tool")


async def test_files_outside_the_scratch_directory_are_neither_written_nor_read(
    tmp_path: Path,
) -> None:
    target = tmp_path / "outside.txt"
    with pytest.raises(sandbox.ToolFailed, match=r"may not open .* to write"):
        await call("write_outside", path=str(target))
    assert not target.exists()
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    with pytest.raises(sandbox.ToolFailed, match="may not open"):
        await call("read_outside", path=str(secret))
