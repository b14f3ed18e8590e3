"""How the solver-verifier workflow asks its verifier on real data (`workflow.verifier`).

The built-in format (no `workflow.verifier`) suits the generated tasks and text policies:
the problem, the candidate and "?", then the verifier's working and one character, "y" or
"n" (`polyrl.workers.workflows.solver_verifier.verdicts`). A chat policy on a dataset is
asked through chat messages instead, with the problem and the candidate put into them, and
its verdict is read with a pattern: these are the fields here. They are checked against each
other when the job is read (a worked verdict must parse to its own verdict), so a pattern
that cannot read the answer template fails the manifest, not the training.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from polyrl.api.base import ApiModel

PROBLEM, CANDIDATE = "{problem}", "{candidate}"
WORKING, VERDICT = "{working}", "{verdict}"


class ChatMessage(ApiModel):
    role: Literal["system", "user", "assistant"] = Field(description="Who says it.")
    content: str = Field(
        min_length=1,
        max_length=8192,
        description="Its text; `{problem}` and `{candidate}` are replaced by the problem's "
        "text and the solver's answer.",
    )


class VerifierSpec(ApiModel):
    """The verifier's chat template and verdict parser (the verifier needs promptFormat: chat)."""

    # What the API server can check itself (CEL); the pattern is checked when the job is read.
    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.messages.exists(m, m.content.contains('{candidate}'))",
                    "message": "workflow.verifier.messages must show the solver's answer: "
                    "put {candidate} in one of them",
                },
                {
                    "rule": "self.answer.contains('{verdict}')",
                    "message": "workflow.verifier.answer must contain {verdict}",
                },
                {
                    "rule": "self.right != self.wrong",
                    "message": "workflow.verifier.right and .wrong must differ",
                },
            ]
        }
    }

    messages: list[ChatMessage] = Field(
        min_length=1,
        max_length=16,
        description="The verifier's prompt as chat messages, with `{problem}` and `{candidate}`.",
    )
    answer: str = Field(
        "{working}\nVerdict: {verdict}",
        max_length=1024,
        description="What a right verifier writes, the target of its supervised warm-up: "
        "`{working}` is the reference answer, `{verdict}` the right or wrong word.",
    )
    # Not `yes` and `no` as field names: YAML 1.1 (kubectl) reads those keys as booleans.
    right: str = Field(
        "yes",
        min_length=1,
        max_length=64,
        description="The verdict word for a right answer (quote yes in YAML).",
    )
    wrong: str = Field(
        "no",
        min_length=1,
        max_length=64,
        description="The verdict word for a wrong answer (quote no in YAML).",
    )
    verdict_pattern: str = Field(
        r"(?i)verdict:\s*(\w+)",
        min_length=1,
        max_length=512,
        description="A regular expression whose first group, at its last match in the "
        "completion, is the verdict (compared with `right` and `wrong`, case-insensitively); no match "
        "is no verdict, which scores as wrong.",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=32768,
        description="The verifier's generation budget; default the solver's maxNewTokens + 16.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> VerifierSpec:
        if not any(CANDIDATE in m.content for m in self.messages):
            raise ValueError("workflow.verifier.messages must show the solver's answer: "
                             "put {candidate} in one of them")  # fmt: skip
        if VERDICT not in self.answer:
            raise ValueError("workflow.verifier.answer must contain {verdict}")
        if self.right.casefold() == self.wrong.casefold():
            raise ValueError("workflow.verifier.right and .wrong must differ")
        try:
            pattern = re.compile(self.verdict_pattern)
        except re.error as err:
            raise ValueError(f"workflow.verifier.verdictPattern does not compile: {err}") from None
        if pattern.groups < 1:
            raise ValueError("workflow.verifier.verdictPattern needs a group: (...)")
        for word, meaning in ((self.right, True), (self.wrong, False)):
            said = self.parse(self.render(working="42", verdict=meaning))
            if said is not meaning:
                raise ValueError(
                    f"workflow.verifier.verdictPattern cannot read its own answer template: "
                    f"{self.render(working='42', verdict=meaning)!r} reads as {said} "
                    f"instead of {word!r}"
                )
        return self

    def render(self, *, working: str, verdict: bool) -> str:
        """The answer template filled: the worked verdict a right verifier writes."""
        word = self.right if verdict else self.wrong
        return self.answer.replace(WORKING, working).replace(VERDICT, word)

    def parse(self, completion: str) -> bool | None:
        """The verdict at the pattern's last match: True for yes, False for no, else None."""
        matches = list(re.finditer(self.verdict_pattern, completion))
        if not matches:
            return None
        word = (matches[-1].group(1) or "").strip().casefold()
        if word == self.right.casefold():
            return True
        return False if word == self.wrong.casefold() else None

    def prompt(self, *, problem: str, candidate: str) -> list[dict[str, str]]:
        """The chat messages for judging `candidate` as the answer to `problem`."""
        return [
            {
                "role": m.role,
                "content": m.content.replace(PROBLEM, problem).replace(CANDIDATE, candidate),
            }
            for m in self.messages
        ]
