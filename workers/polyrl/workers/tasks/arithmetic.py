"""`arithmetic`: "12+35=" -> "47", the smallest task a tiny model can learn and RL can improve.

Params: `digits` (1-9, default 2): operands are drawn from [0, 10**digits); `ops` (default "+"):
the operators to draw from, any of "+-*/". Division problems are built as `(b*q)/b`, so every
answer is an integer and the dividend keeps at most `digits` digits. Subtraction answers may be
negative ("3-5=" -> "-2").

The reward is 1.0 iff the answer text, cut at the first space, is exactly the answer: no
leading zeros, no "+", no trailing junk glued to the number.
"""

from __future__ import annotations

import math
import random

from polyrl.workers.tasks import base

NAME = "arithmetic"
OPERATORS = "+-*/"


class Arithmetic(base.GeneratedTask):
    def __init__(self, *, digits: int, ops: str, held_out: int, seed: int) -> None:
        if not ops or any(op not in OPERATORS for op in ops):
            raise ValueError(f"task {NAME}: ops must be made of {OPERATORS!r}, got {ops!r}")
        self.digits = digits
        self.ops = "".join(sorted(set(ops), key=OPERATORS.index))
        super().__init__(held_out=held_out, seed=seed)

    @property
    def name(self) -> str:
        return NAME

    def space_size(self) -> int:
        limit = 10**self.digits
        pairs = {"+": limit * limit, "-": limit * limit, "*": limit * limit}
        # (b, q) with b >= 1 and b*q < limit: q = 0 for every b, plus the divisor-sum.
        pairs["/"] = (limit - 1) + _divisor_summatory(limit - 1)
        return sum(pairs[op] for op in self.ops)

    def generate(self, rng: random.Random) -> base.Problem:
        limit = 10**self.digits
        op = rng.choice(self.ops)
        if op == "/":
            divisor = rng.randrange(1, limit)
            quotient = rng.randrange(0, (limit - 1) // divisor + 1)
            left, right, answer = divisor * quotient, divisor, quotient
        else:
            left, right = rng.randrange(limit), rng.randrange(limit)
            answer = {"+": left + right, "-": left - right, "*": left * right}[op]
        prompt = f"{left}{op}{right}="
        return base.Problem(prompt=prompt, answer=str(answer), id=base.problem_id(NAME, prompt))

    def reward(self, problem: base.Problem, completion: str) -> float:
        text = base.answer_text(completion)
        return 1.0 if text.split(" ", 1)[0] == problem.answer else 0.0


def _divisor_summatory(n: int) -> int:
    """sum of n // k for k in 1..n, in O(sqrt n) (Dirichlet's hyperbola method)."""
    root = math.isqrt(n)
    return 2 * sum(n // k for k in range(1, root + 1)) - root * root


def make(params: base.Params, *, held_out: int, seed: int) -> Arithmetic:
    base.check_known(NAME, params, {"digits", "ops"})
    digits = base.int_param(NAME, params, "digits", 2, 1, 9)
    ops = params.get("ops", "+")
    if not isinstance(ops, str):
        raise ValueError(f"task {NAME}: param ops must be a string such as '+-', got {ops!r}")
    return Arithmetic(digits=digits, ops=ops, held_out=held_out, seed=seed)
