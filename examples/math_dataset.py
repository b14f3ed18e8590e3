"""Prepare the data of examples/math-dataset.yaml: GSM8K-style word problems, written in the
formats users bring.

    python examples/math_dataset.py --out data/math

writes `train.parquet` and `test.parquet` in verl's format (a chat-message `prompt`,
`reward_model: {style: rule, ground_truth}`, `data_source`, `ability`, `extra_info` with the
reference solution, which ends in `\\boxed{answer}`), and `train.jsonl` and `test.jsonl` in
TRL's (`prompt` as chat messages, `solution`, `answer`). The same problems in both: a job reads
either with only `format` changed. Test problems use templates that never occur in training,
so held-out accuracy measures more than recall. Numbers are small (answers below 200) so a tiny
model can learn the arithmetic; seeded, so two runs write the same files.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

SYSTEM = "Solve the problem. Put the final answer in \\boxed{}."
Template = Callable[[random.Random], tuple[str, int, str]]


def _buy(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return (
        f"Sam buys {a} bags with {b} apples in each. How many apples does Sam have?",
        a * b,
        f"{a} bags of {b} apples is {a}*{b}={a * b}.",
    )


def _left(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(20, 99), rng.randint(1, 19)
    return (
        f"Ann has {a} stamps and gives away {b}. How many stamps are left?",
        a - b,
        f"{a}-{b}={a - b}.",
    )


def _total(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(10, 90), rng.randint(10, 90)
    return (
        f"A shop sold {a} pens on Monday and {b} on Tuesday. How many pens did it sell?",
        a + b,
        f"{a}+{b}={a + b}.",
    )


def _share(rng: random.Random) -> tuple[str, int, str]:
    b, q = rng.randint(2, 9), rng.randint(2, 12)
    return (
        f"{b * q} cookies are shared equally by {b} children. How many does each child get?",
        q,
        f"{b * q}/{b}={q}.",
    )


def _more(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(5, 60), rng.randint(5, 60)
    return (
        f"Tom has {a} marbles. Lea has {b} more than Tom. How many marbles does Lea have?",
        a + b,
        f"{a}+{b}={a + b}.",
    )


def _rows(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    return (
        f"A garden has {a} rows of {b} flowers. How many flowers are there?",
        a * b,
        f"{a}*{b}={a * b}.",
    )


# Held out: the same operations, worded as no training problem is.
def _pages(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(10, 90), rng.randint(10, 90)
    return (
        f"Mia read {a} pages yesterday and {b} pages today. How many pages has she read?",
        a + b,
        f"{a}+{b}={a + b}.",
    )


def _boxes(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return (
        f"Each box holds {b} eggs. How many eggs are in {a} boxes?",
        a * b,
        f"{a} boxes of {b} eggs is {a}*{b}={a * b}.",
    )


def _spent(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(20, 99), rng.randint(1, 19)
    return (
        f"Leo had {a} dollars and spent {b}. How many dollars does he have now?",
        a - b,
        f"{a}-{b}={a - b}.",
    )


TRAIN: tuple[Template, ...] = (_buy, _left, _total, _share, _more, _rows)
TEST: tuple[Template, ...] = (_pages, _boxes, _spent)


def rows(templates: tuple[Template, ...], count: int, seed: int) -> list[dict[str, Any]]:
    """`count` distinct problems drawn from `templates`, as verl rows."""
    rng, seen = random.Random(seed), set()
    out: list[dict[str, Any]] = []
    while len(out) < count:
        template = rng.choice(templates)
        question, answer, working = template(rng)
        if question in seen:
            continue
        seen.add(question)
        out.append(
            {
                "data_source": "polyrl/math-words",
                "prompt": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": question},
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {
                    "index": len(out),
                    "solution": f"{working} The answer is \\boxed{{{answer}}}.",
                },
            }
        )
    return out


def to_trl(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": row["prompt"],
        "solution": row["extra_info"]["solution"],
        "answer": row["reward_model"]["ground_truth"],
    }


def write(out: Path, *, train: int = 4000, test: int = 200, seed: int = 0) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    for split, templates, count in (("train", TRAIN, train), ("test", TEST, test)):
        data = rows(templates, count, seed + (split == "test"))
        pq.write_table(pa.Table.from_pylist(data), out / f"{split}.parquet")
        lines = (json.dumps(to_trl(r)) + "\n" for r in data)
        (out / f"{split}.jsonl").write_text("".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/math"), help="output directory")
    parser.add_argument("--train", type=int, default=4000, help="training problems")
    parser.add_argument("--test", type=int, default=200, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.out, train=args.train, test=args.test, seed=args.seed)
    print(f"wrote {args.train} training and {args.test} held-out problems to {args.out}")


if __name__ == "__main__":
    main()
