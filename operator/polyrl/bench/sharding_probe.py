"""One strategy's measurement: `python -m polyrl.bench.sharding_probe SPEC OUT`.

`polyrl bench sharding` runs ddp and fsdp2 each in a fresh process, which spawns its two
ranks (gloo). SPEC (JSON): the model, the batch (as `trainer_probe`), `steps`, `rows` per
micro-batch and `strategy`. Each publishes version 0 (a keyframe) before the steps and
version 1 (a delta) after them, as its trainer would (`Publication`). With fsdp2 the ranks
also save a distributed checkpoint after the first step, which one more rank resumes
(2 -> 1) for one step. Rank 0's figures go to OUT.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from polyrl.bench import rss
from polyrl.bench.trainer_probe import GROUP, samples


def learner(spec: dict[str, Any], workdir: Path, rank: int, world: int) -> tuple[Any, float]:
    """The rank's Learner, synced (fsdp2: sharded, a checkpoint's shards loaded) and the
    seconds the sync took."""
    from polyrl.api.resources import AlgorithmSpec, PolicySpec
    from polyrl.workers.trainer.learner import Learner

    trainer = {
        "batchSize": spec["samples"],
        "microBatchSize": spec["rows"],
        "strategy": spec["strategy"],
        "optimizer": {"lr": 1e-5},
    }
    policy = PolicySpec.model_validate(
        {"name": "bench", "model": {"path": spec["model"]}, "trainer": trainer}
    )
    made = Learner(policy, AlgorithmSpec(group_size=GROUP), workdir=workdir, rank=rank, world=world)
    started = time.perf_counter()
    made.sync_from_leader()
    return made, time.perf_counter() - started


def rank_main(rank: int, world: int, spec: dict[str, Any], workdir: Path, out: Path) -> None:
    """One rank: `steps` steps (a resumed one: 1), saving a checkpoint after the first
    (fsdp2), then one publication; rank 0 writes the figures."""
    import torch
    import torch.distributed as dist

    from polyrl.workers.trainer import sharding

    torch.set_num_threads(spec["threads"])
    init = f"file://{out}.init"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    made, sync_seconds = learner(spec, workdir, rank, world)
    batch = samples(spec, len(made.tokenizer))
    resumed, sharded = spec.get("resumed", False), spec["strategy"] == "fsdp2"
    figures: dict[str, Any] = {
        "shard_and_load_s": round(sync_seconds, 3),
        "rss_before_steps_gb": rss.current_gb(),  # the model, sharded or whole, before any step
    }
    publication = Publication(made, rank, world)
    figures |= publication.measure("keyframe", 0)  # the first version: every tensor whole
    rss.reset_peak()
    seconds, losses = [], []
    for step in range(1 if resumed else spec["steps"]):
        started = time.perf_counter()
        losses.append(made.step(batch)["loss"])
        seconds.append(time.perf_counter() - started)
        if step == 0 and sharded and not resumed:
            started = time.perf_counter()
            made.save()  # a distributed checkpoint: each rank its shards
            figures["checkpoint_save_s"] = round(time.perf_counter() - started, 3)
    figures |= sharding.held_bytes(made.model, made.optimizer)
    figures["peak_rss_gb"] = rss.peak_gb()
    figures |= publication.measure("delta", 1)  # what the steps changed
    figures["step_s"] = round(statistics.median(seconds), 3)
    figures["losses"] = _mean_over_ranks(losses, world)
    if rank == 0:
        out.write_text(json.dumps(figures))
    dist.barrier()  # leave together: a rank torn down while its peer still works aborts
    dist.destroy_process_group()


class Publication:
    """A version published as the strategy's trainer does, without NATS (the bytes are
    counted, not written): data-parallel, rank 0 casts the whole weights to bf16 and encodes
    them (on a thread here; the trainer uses a process of its own); sharded, every rank
    encodes its rows and rank 0 receives the other ranks' parts one at a time."""

    def __init__(self, made: Any, rank: int, world: int) -> None:
        from polyrl.workers.deltas.encoders.inline import InlineEncoder

        self.made, self.rank, self.world = made, rank, world
        self.encoder = InlineEncoder()
        self.last: Any = None

    def measure(self, kind: str, version: int) -> dict[str, Any]:
        """Time, bytes and peak resident memory (rank 0's, and the largest of any rank's
        rise above what it held before) of publishing `version`."""
        import torch.distributed as dist

        before = rss.current_gb()
        rss.reset_peak()
        started = time.perf_counter()
        size = self._parts(version) if self.made.sharded else self._whole(version)
        seconds = time.perf_counter() - started
        rises: list[Any] = [None] * self.world
        dist.all_gather_object(rises, rss.peak_gb() - before)
        return {
            f"publish_{kind}_s": round(seconds, 3),
            f"publish_{kind}_bytes": size,
            f"publish_{kind}_peak_rss_gb": rss.peak_gb(),
            f"publish_{kind}_max_rise_gb": round(max(rises), 3),
        }

    def _whole(self, version: int) -> int:
        if self.rank != 0:
            return 0
        snapshot = self.encoder.snapshot(self.made.published(), keep=self.last)
        if self.last is None:
            blob = self.encoder.keyframe(snapshot, version=version)
        else:
            blob = self.encoder.delta(
                self.last, snapshot, base_version=version - 1, new_version=version
            )
        self.last = snapshot
        return len(blob)

    def _parts(self, version: int) -> int:
        assert self.made.parts is not None
        size = 0
        for part in self.made.publish_part(version):
            size += len(part.blob)
            for other in range(1, self.world if self.rank == 0 else 1):
                size += len(self.made.parts.receive(other))  # written, then dropped
        return size


def _mean_over_ranks(losses: list[float], world: int) -> list[float]:
    import torch
    import torch.distributed as dist

    total = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(total)
    return [float(x) / world for x in total]  # each rank's loss is its share over the ranks


def main(argv: list[str]) -> int:
    import torch.multiprocessing as mp

    spec = json.loads(Path(argv[1]).read_text())
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-sharding-") as scratch:
        workdir, out = Path(scratch), Path(scratch) / "figures.json"
        mp.spawn(rank_main, args=(2, spec, workdir, out), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
        figures = json.loads(out.read_text())
        if spec["strategy"] == "fsdp2":  # the checkpoint after step 1, resumed on one rank
            again = Path(scratch) / "resumed.json"
            resumed = spec | {"resumed": True}
            mp.spawn(rank_main, args=(1, resumed, workdir, again), nprocs=1, join=True)  # type: ignore[attr-defined,no-untyped-call]
            one = json.loads(again.read_text())
            figures["resume_on_1_rank_shard_and_load_s"] = one["shard_and_load_s"]
            gap = abs(one["losses"][0] - figures["losses"][1])
            figures["resume_on_1_rank_next_loss_abs_diff"] = gap
    Path(argv[2]).write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
