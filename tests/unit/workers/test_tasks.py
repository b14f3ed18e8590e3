"""Built-in tasks: exact rewards, a held-out split training never sees, clear loading errors."""

from __future__ import annotations

import random
import sys
import types
from collections.abc import Iterator, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyrl.api.resources import TaskSpec
from polyrl.workers import tasks
from polyrl.workers.tasks import arithmetic, base, countdown
from polyrl.workers.workflows.solver_verifier import verdicts as verify


def load(
    name: str, params: Mapping[str, int | str] | None = None, *, held_out: int = 100, seed: int = 0
) -> tasks.Task:
    spec = TaskSpec(name=name, params=dict(params or {}), held_out=held_out, seed=seed)
    return tasks.load_task(spec)


def problem(prompt: str, answer: str) -> base.Problem:
    return base.Problem(prompt=prompt, answer=answer, id=base.problem_id("test", prompt))


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("47", 1.0),
        ("47</s>", 1.0),
        ("47\n12+1=13", 1.0),
        ("47 because", 1.0),
        (" 47", 1.0),
        ("46", 0.0),
        ("", 0.0),
        ("047", 0.0),
        ("+47", 0.0),
        ("47abc", 0.0),
        ("4 7", 0.0),
        ("47.0", 0.0),
    ],
)
def test_arithmetic_reward_is_exact(completion: str, reward: float) -> None:
    task = load("arithmetic")
    assert task.reward(problem("12+35=", "47"), completion) == reward


@pytest.mark.parametrize(
    ("value", "text"), [(0, "0"), (7, "7"), (47, "74"), (120, "021"), (-12, "-21"), (-3, "-3")]
)
def test_reversed_answers_write_the_digits_least_significant_first(value: int, text: str) -> None:
    assert arithmetic.written(value, reverse=True) == text
    assert arithmetic.written(value, reverse=False) == str(value)


def test_reversed_arithmetic_keeps_the_prompts_and_the_held_out_split() -> None:
    plain = load("arithmetic", {"ops": "+-"})
    reverse = load("arithmetic", {"ops": "+-", "reverse": True})
    pairs = list(zip(plain.held_out(), reverse.held_out(), strict=True))
    assert [a.id for a, _ in pairs] == [b.id for _, b in pairs]
    for a, b in pairs:
        assert b.answer == arithmetic.written(int(a.answer), reverse=True)
        assert reverse.reward(b, b.answer) == 1.0
        if a.answer != b.answer:  # a palindrome reads the same both ways
            assert reverse.reward(b, a.answer) == 0.0


def test_arithmetic_asked_as_a_chat_question_rewards_the_first_number() -> None:
    plain = load("arithmetic", {"digits": 1})
    chat = load(
        "arithmetic",
        {
            "digits": 1,
            "template": "What is {left} {op} {right}?",
            "system": "Reply with only the number.",
            "match": "first-number",
        },
    )
    problem = chat.held_out()[0]
    left, right = (int(n) for n in problem.prompt.removeprefix("What is ").rstrip("?").split(" + "))
    assert problem.answer == str(left + right)
    assert problem.request == [
        {"role": "system", "content": "Reply with only the number."},
        {"role": "user", "content": f"What is {left} + {right}?"},
    ]
    assert len(chat.held_out()) == len(plain.held_out())
    assert chat.reward(problem, f"The answer is {problem.answer}.") == 1.0
    assert chat.reward(problem, f"{problem.answer}<|im_end|>") == 1.0
    assert chat.reward(problem, f"{left} + {right} = {problem.answer}") == (left == left + right)
    assert chat.reward(problem, "I do not know") == 0.0
    last = load(
        "arithmetic",
        {"digits": 1, "template": "What is {left} {op} {right}?", "match": "last-number"},
    )
    problem = last.held_out()[0]
    assert last.reward(problem, f"{problem.prompt[8:-1]} = {problem.answer}") == 1.0
    assert last.reward(problem, f"{problem.answer} or {int(problem.answer) + 1}") == 0.0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"template": "{left} plus {x}"}, r"template .* must use only \{left\}"),
        ({"match": "middle-number"}, "match must be one of prefix, first-number, last-number"),
        ({"system": ""}, "param system must be a non-empty string"),
    ],
)
def test_arithmetic_refuses_a_bad_template_match_or_system(
    params: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load("arithmetic", params)


def test_arithmetic_answers_are_right_for_every_operator() -> None:
    task = load("arithmetic", {"digits": 2, "ops": "+-*/"})
    rng = random.Random(1)
    for _ in range(400):
        p = task.sample(rng)
        left, op, right = _split_arithmetic(p.prompt)
        assert 0 <= left < 100
        assert 0 <= right < 100
        expected = {"+": left + right, "-": left - right, "*": left * right}.get(op)
        if op == "/":
            assert left % right == 0
            expected = left // right
        assert p.answer == str(expected)
        assert task.reward(p, p.answer) == 1.0


def test_arithmetic_max_draws_operands_up_to_it_and_sizes_the_held_out_split() -> None:
    task = load("arithmetic", {"max": 19, "ops": "+/"}, held_out=200)
    rng = random.Random(2)
    seen: set[int] = set()
    for _ in range(2000):
        left, op, right = _split_arithmetic(task.sample(rng).prompt)
        assert 0 <= left <= 19
        assert 0 <= right <= 19
        seen.update((left, right) if op == "+" else ())
    assert max(seen) == 19  # the bound is reached, not just respected
    assert len(task.held_out()) == 200  # 400 sums and 79 quotients: room for 200
    with pytest.raises(ValueError, match=r"param max must be an integer in \[1, 999999999\]"):
        load("arithmetic", {"max": 0})


def _split_arithmetic(prompt: str) -> tuple[int, str, int]:
    body = prompt.removesuffix("=")
    for op in "+-*/":
        if op in body:
            left, right = body.split(op)
            return int(left), op, int(right)
    raise AssertionError(prompt)


COUNTDOWN = problem("3,5,7,3 to 22:", "3*5+7")


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("3*5+7", 1.0),
        ("7+5*3", 1.0),
        ("(7+5*3)", 1.0),
        (" 5 * 3 + 7 \nmore", 1.0),
        ("3*(5+7)-3*7+7", 0.0),  # 7 used twice
        ("3*5+7+3-3", 0.0),  # 3 is given twice, used three times
        ("22", 0.0),  # not a given number
        ("3*5+8-1", 0.0),
        ("3*5+7-0", 0.0),  # 0 is not given either
        ("7*3+3/3", 0.0),  # division
        ("3*5+7//1", 0.0),
        ("-3+5*5", 0.0),  # unary minus
        ("0x3*5+7", 0.0),
        ("3_0", 0.0),
        ("3**2+13", 0.0),
        ("3*5+", 0.0),
        ("__import__('os').system('true')", 0.0),
        ("(lambda: 22)()", 0.0),
        ("", 0.0),
        ("3*5+7" + "+0" * 100, 0.0),
    ],
)
def test_countdown_reward_accepts_only_arithmetic_over_the_given_numbers(
    completion: str, reward: float
) -> None:
    task = load("countdown")
    assert task.reward(COUNTDOWN, completion) == reward


def test_countdown_reward_allows_a_number_as_often_as_it_is_given() -> None:
    task = load("countdown")
    twice = problem("3,3,4 to 10:", "3+3+4")
    assert task.reward(twice, "3+3+4") == 1.0
    assert task.reward(twice, "3*3+4-3") == 0.0


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 5))
def test_countdown_problems_are_solved_by_their_reference_answer(seed: int, numbers: int) -> None:
    task = countdown.make({"numbers": numbers}, held_out=0, seed=0)
    p = task.sample(random.Random(seed))
    given_numbers, target = countdown.parse_prompt(p.prompt)
    assert len(given_numbers) == numbers
    assert 1 <= target <= 100
    assert task.reward(p, p.answer) == 1.0


@pytest.mark.parametrize(
    ("name", "params"), [("arithmetic", {"digits": 1}), ("countdown", {"max_number": 4})]
)
def test_training_sampling_never_produces_held_out_problems(
    name: str, params: dict[str, int]
) -> None:
    task = load(name, params, held_out=1000)
    held_out = {p.id for p in task.held_out()}
    rng = random.Random(7)
    sampled = {task.sample(rng).id for _ in range(3000)}
    assert held_out
    assert not held_out & sampled


def test_held_out_split_is_capped_at_half_of_a_small_problem_space() -> None:
    task = load("arithmetic", {"digits": 1}, held_out=1000)
    assert len(task.held_out()) == 50
    rng = random.Random(0)
    # Everything not held out is still reachable for training.
    assert len({task.sample(rng).id for _ in range(3000)}) == 50


def test_held_out_split_is_fixed_by_the_seed() -> None:
    first = load("arithmetic", held_out=20, seed=1).held_out()
    assert first == load("arithmetic", held_out=20, seed=1).held_out()
    assert first != load("arithmetic", held_out=20, seed=2).held_out()
    assert len({p.id for p in first}) == 20


def test_problem_ids_are_stable_and_follow_the_prompt() -> None:
    assert base.problem_id("arithmetic", "1+2=") == base.problem_id("arithmetic", "1+2=")
    assert base.problem_id("arithmetic", "1+2=") != base.problem_id("arithmetic", "2+1=")
    assert base.problem_id("arithmetic", "1+2=").startswith("arithmetic-")


@pytest.fixture
def user_module() -> Iterator[types.ModuleType]:
    module = types.ModuleType("polyrl_test_user_tasks")
    module.not_a_task = lambda params, *, held_out, seed: object()  # type: ignore[attr-defined]
    module.CONSTANT = 3  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


@pytest.mark.usefixtures("user_module")
@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("sudoku", {}, "unknown task 'sudoku'"),
        ("no_such_module_xyz:make", {}, "cannot import 'no_such_module_xyz'"),
        ("polyrl_test_user_tasks:missing", {}, "no callable 'missing'"),
        ("polyrl_test_user_tasks:CONSTANT", {}, "no callable 'CONSTANT'"),
        ("polyrl_test_user_tasks:not_a_task", {}, "returned object"),
        (":make", {}, "unknown task ':make'"),
        ("arithmetic", {"digit": 2}, r"unknown params \['digit'\]"),
        ("arithmetic", {"digits": 0}, "param digits must be an integer in"),
        ("arithmetic", {"digits": True}, "param digits must be an integer in"),
        ("arithmetic", {"ops": "+^"}, "ops must be made of"),
        ("arithmetic", {"reverse": "yes"}, "param reverse must be true or false"),
        ("countdown", {"min_target": 5, "max_target": 4}, "min_target must be <= max_target"),
    ],
)
def test_load_task_names_what_is_wrong(
    name: str, params: dict[str, int | str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load(name, params)


def test_load_task_accepts_a_module_function_entry_point() -> None:
    task = load("polyrl.workers.tasks.arithmetic:make", {"digits": 1}, held_out=5)
    assert isinstance(task, arithmetic.Arithmetic)
    assert task.name == "arithmetic"
    assert len(task.held_out()) == 5


def test_verifier_prompt_appends_the_candidate_answer_and_a_question_mark() -> None:
    p = problem("12+35=", "47")
    assert verify.verify_prompt(p, "47") == "12+35=47?"
    assert verify.verify_prompt(p, " 46\nnoise</s>") == "12+35=46?"
    assert (verify.verify_answer(True), verify.verify_answer(False)) == ("y", "n")
    assert verify.verify_answer(False, "47") == "47n"


@pytest.mark.parametrize(
    ("completion", "verdict"),
    [
        ("y", True),
        ("n", False),
        (" y\n", True),
        ("47y", True),
        ("46n</s>", False),
        ("47y\nnoise", True),
        ("no", None),
        ("y4", None),
        ("", None),
        ("x", None),
    ],
)
def test_parse_verdict_reads_the_last_character_after_the_working(
    completion: str, verdict: bool | None
) -> None:
    assert verify.parse_verdict(completion) is verdict


def test_built_in_tasks_satisfy_the_task_protocol() -> None:
    assert isinstance(load("arithmetic"), tasks.Task)
    assert isinstance(load("countdown"), tasks.Task)
