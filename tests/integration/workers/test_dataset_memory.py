"""A dataset task reads its file as memory-mapped Arrow: a million-row parquet costs a worker
little more memory than a fifty-row one (each measured in a fresh process, with a fresh
`datasets` cache, so the one-time conversion into the cache is counted too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow

MEASURE = """
import random, sys
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
from polyrl.workers.tasks import dataset
import datasets  # imported before the baseline: its import is the same for any file
before = rss_mb()
task = dataset.make({"path": sys.argv[1], "format": "plain"}, held_out=100, seed=0)
rng = random.Random(0)
problems = [task.sample(rng) for _ in range(2000)]
print(rss_mb() - before)
"""


def grown_mb(path: Path, cache: Path) -> int:
    env = {"HF_DATASETS_CACHE": str(cache), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.strip().splitlines()[-1])


def test_a_million_row_parquet_grows_a_workers_memory_by_less_than_200_mb(tmp_path: Path) -> None:
    for rows, name in ((50, "small"), (1_000_000, "big")):
        prompts = [f"What is {i} plus {i % 97}? Answer with a number." for i in range(rows)]
        answers = [str(i + i % 97) for i in range(rows)]
        pq.write_table(
            pa.table({"prompt": prompts, "answer": answers}), tmp_path / f"{name}.parquet"
        )
    small = grown_mb(tmp_path / "small.parquet", tmp_path / "cache-small")
    big = grown_mb(tmp_path / "big.parquet", tmp_path / "cache-big")
    assert big - small < 200, (small, big)
