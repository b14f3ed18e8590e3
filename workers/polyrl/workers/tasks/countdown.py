"""`countdown`: reach a target from given numbers with + - * and parentheses.

"3,5,7 to 22:" asks for an expression such as "3*5+7". Unlike arithmetic, many answers are
right, so the reward checks the expression rather than comparing text: it must use only the
given numbers, each at most as often as it is given, only + - * and parentheses, and evaluate
to the target. Checking parses the expression with `ast` and evaluates the tree itself; nothing
the model writes is ever handed to `eval`, and anything outside that grammar scores 0.

Params: `numbers` (2-6, default 3) drawn from [1, `max_number`] (default 10); targets lie in
[`min_target`, `max_target`] (default 1-100). Every problem is solvable: the generator combines
all the numbers in a random expression tree and keeps its value as the target (that expression
is the problem's reference `answer`).
"""

from __future__ import annotations

import ast
import collections
import random
import re

from polyrl.workers.tasks import base

NAME = "countdown"
MAX_EXPRESSION = 200
_PROMPT = re.compile(r"^(\d+(?:,\d+)*) to (-?\d+):$")
_EXPRESSION_CHARS = re.compile(r"^[0-9+\-*() ]+$")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2}
GENERATE_ATTEMPTS = 1000

# An expression tree: a number, or (operator, left, right).
Tree = int | tuple[str, "Tree", "Tree"]


class Countdown(base.GeneratedTask):
    def __init__(
        self, *, numbers: int, max_number: int, targets: range, held_out: int, seed: int
    ) -> None:
        if not targets:
            raise ValueError(f"task {NAME}: min_target must be <= max_target")
        self.numbers, self.max_number, self.targets = numbers, max_number, targets
        super().__init__(held_out=held_out, seed=seed)

    @property
    def name(self) -> str:
        return NAME

    def space_size(self) -> int:
        # Ordered number tuples; most have several reachable targets, so this is a rough
        # floor for the default ranges rather than a bound for every setting.
        return int(self.max_number**self.numbers)

    def generate(self, rng: random.Random) -> base.Problem:
        for _ in range(GENERATE_ATTEMPTS):
            given = [rng.randint(1, self.max_number) for _ in range(self.numbers)]
            tree = _random_tree(rng, rng.sample(given, len(given)))
            target = _evaluate_tree(tree)
            if target in self.targets:
                prompt = f"{','.join(map(str, given))} to {target}:"
                answer = _render(tree)
                return base.Problem(prompt=prompt, answer=answer, id=base.problem_id(NAME, prompt))
        raise ValueError(
            f"task {NAME}: no target in [{self.targets.start}, {self.targets.stop - 1}] "
            f"after {GENERATE_ATTEMPTS} tries; widen the target range"
        )

    def reward(self, problem: base.Problem, completion: str) -> float:
        given, target = parse_prompt(problem.prompt)
        result = check_expression(base.answer_text(completion), given)
        return 1.0 if result == target else 0.0


def parse_prompt(prompt: str) -> tuple[list[int], int]:
    """The given numbers and the target of a countdown prompt."""
    match = _PROMPT.match(prompt)
    if match is None:
        raise ValueError(f"not a countdown prompt: {prompt!r}")
    return [int(n) for n in match.group(1).split(",")], int(match.group(2))


def check_expression(text: str, given: list[int]) -> int | None:
    """The value of `text` if it is a valid answer over `given`, else None."""
    # The character check also rules out what ast would accept but a person would not call
    # using the numbers: hex or underscored literals, names, calls, attributes.
    if not text or len(text) > MAX_EXPRESSION or not _EXPRESSION_CHARS.match(text):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    used: list[int] = []
    value = _evaluate_node(tree, used)
    if value is None or collections.Counter(used) - collections.Counter(given):
        return None
    return value


def _evaluate_node(node: ast.expr, used: list[int]) -> int | None:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            return None
        used.append(node.value)
        return node.value
    if not isinstance(node, ast.BinOp) or type(node.op) not in _OPS:
        return None
    left, right = _evaluate_node(node.left, used), _evaluate_node(node.right, used)
    if left is None or right is None:
        return None
    return _apply(_OPS[type(node.op)], left, right)


def _apply(op: str, left: int, right: int) -> int:
    return left + right if op == "+" else left - right if op == "-" else left * right


def _random_tree(rng: random.Random, leaves: list[int]) -> Tree:
    nodes: list[Tree] = list(leaves)
    while len(nodes) > 1:
        i = rng.randrange(len(nodes) - 1)
        nodes[i : i + 2] = [(rng.choice("+-*"), nodes[i], nodes[i + 1])]
    return nodes[0]


def _evaluate_tree(tree: Tree) -> int:
    if isinstance(tree, int):
        return tree
    op, left, right = tree
    return _apply(op, _evaluate_tree(left), _evaluate_tree(right))


def _render(tree: Tree) -> str:
    """The expression with only the parentheses precedence requires."""
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    left_text, right_text = _render(left), _render(right)
    if isinstance(left, tuple) and _PRECEDENCE[left[0]] < _PRECEDENCE[op]:
        left_text = f"({left_text})"
    if isinstance(right, tuple) and (
        _PRECEDENCE[right[0]] < _PRECEDENCE[op]
        or (op == "-" and _PRECEDENCE[right[0]] == _PRECEDENCE[op])
    ):
        right_text = f"({right_text})"
    return f"{left_text}{op}{right_text}"


def make(params: base.Params, *, held_out: int, seed: int) -> Countdown:
    base.check_known(NAME, params, {"numbers", "max_number", "min_target", "max_target"})
    numbers = base.int_param(NAME, params, "numbers", 3, 2, 6)
    max_number = base.int_param(NAME, params, "max_number", 10, 1, 1000)
    low = base.int_param(NAME, params, "min_target", 1, -(10**6), 10**6)
    high = base.int_param(NAME, params, "max_target", 100, -(10**6), 10**6)
    return Countdown(
        numbers=numbers,
        max_number=max_number,
        targets=range(low, high + 1),
        held_out=held_out,
        seed=seed,
    )
