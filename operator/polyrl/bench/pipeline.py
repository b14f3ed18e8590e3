"""`polyrl bench pipeline`: the quick-start job in async and in sync mode, same steps, one run.

Both modes run the same job on this machine through `LocalRun` (the real workers, the
embedded nats-server), one after the other, to the same number of trainer steps. The
figures come from what the workers themselves report: trainer metrics (step time, time spent
waiting for samples, staleness, held-out accuracy) and heartbeats (rollout tokens/s, the
share of time each worker had nothing to do), sampled while the job runs.

`ideal_speedup` is what perfect overlap of generation and training could give, from the sync
run's own per-step times: sync mode pays t_gen + t_train per step, a perfect pipeline pays
max(t_gen, t_train). `speedup_vs_ideal` is the measured speedup over that bound.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from polyrl.api.messages import Heartbeat
from polyrl.api.naming import JobNames
from polyrl.api.resources import RLJob
from polyrl.local import jobfile, report, runner

QUICK_STEPS, FULL_STEPS = 8, 40
QUICK_WARMUP = 50  # enough to exercise the warm start; the full run keeps the job's own


def job_path() -> Path:
    """The quick-start job of this checkout (or POLYRL_BENCH_JOB)."""
    explicit = os.environ.get("POLYRL_BENCH_JOB")
    if explicit:
        return Path(explicit)
    return Path(__file__).resolve().parents[3] / "examples" / "quickstart.yaml"


def variant(job: RLJob, *, mode: str, steps: int, warmup: int | None) -> RLJob:
    """The job in `mode`, every policy stopping after `steps` (a policy's own trainer.steps is
    dropped: both modes train the same steps, and sync mode refuses it); `warmup` overrides
    warm-up steps if given. `uniformGroups: refill` becomes `skip`, which is what sync mode
    makes of it: refilling async batches would have async mode generate several times as much
    per step (six times with a policy at chance, as after the quick run's short warm-up)."""
    doc = job.model_dump(by_alias=True, exclude_none=True)
    doc["metadata"]["name"] = f"{job.metadata.name}-{mode}"
    doc["spec"]["algorithm"]["mode"] = mode
    doc["spec"]["stop"] = {"steps": steps}
    for policy in doc["spec"]["policies"]:
        policy["trainer"].pop("steps", None)
        if policy["trainer"].get("uniformGroups") == "refill":
            policy["trainer"]["uniformGroups"] = "skip"
        if warmup is not None and policy["trainer"].get("warmupSteps"):
            policy["trainer"]["warmupSteps"] = warmup
    return RLJob.model_validate(doc)


async def _heartbeats(url: str, creds: Path, names: JobNames) -> list[Heartbeat]:
    import nats

    nc = await nats.connect(
        url, user_credentials=str(creds), connect_timeout=2, max_reconnect_attempts=0
    )
    try:
        kv = await nc.jetstream().key_value(names.heartbeats_bucket)
        beats = []
        for key in await kv.keys():
            entry = await kv.get(key)
            beats.append(Heartbeat.model_validate_json(entry.value or b"{}"))
        return beats
    finally:
        await nc.close()


def run_mode(job: RLJob, run_dir: Path) -> dict[str, Any]:
    """Run `job` locally to its stop; its metrics and the last heartbeats of each worker."""
    run = runner.LocalRun(job, run_dir)
    names = JobNames(namespace=job.metadata.namespace, job=job.metadata.name)
    beats: dict[str, Heartbeat] = {}
    last = 0.0

    def sample() -> None:
        nonlocal last
        if run.nats is None or time.monotonic() - last < 3:
            return
        last = time.monotonic()
        try:
            for beat in asyncio.run(_heartbeats(run.nats.url, run.admin_creds, names)):
                if beat.role != "trainer" or beat.step > 0:
                    beats[beat.pod] = beat
        except Exception:  # the job's streams may not exist yet; try at the next tick
            return

    started = time.time()
    try:
        run.start()
        runner.wait(run, on_tick=sample)
    finally:
        run.stop()
    return {
        "metrics": report.read_metrics(run.metrics),
        "beats": list(beats.values()),
        "seconds_total": time.time() - started,
    }


def mode_figures(result: dict[str, Any], first_policy: str, batch: int) -> dict[str, Any]:
    everything: dict[str, list[dict[str, Any]]] = result["metrics"]
    # Step 0 is the evaluation before RL starts; timings come from the training steps.
    metrics = {p: [r for r in rs if r["step"] >= 1] for p, rs in everything.items()}
    metrics = {p: rs for p, rs in metrics.items() if rs}
    if not metrics or first_policy not in metrics:
        raise RuntimeError("no trainer step was recorded; see the run's logs")
    # RL starts once every trainer waits for its first batch: a policy with a warm start
    # gets there minutes after one without, and that wait is the same in both modes.
    start = max(
        r[0]["time"] - r[0]["step_seconds"] - r[0].get("wait_seconds", 0.0)
        for r in metrics.values()
    )
    end = max(r[-1]["time"] for r in metrics.values())
    solver = metrics[first_policy]
    steady = solver[1:] or solver  # step 1 also waits for the pipeline to fill
    step_seconds = statistics.mean(r["step_seconds"] for r in steady)
    wait_seconds = statistics.mean(r.get("wait_seconds", 0.0) for r in steady)
    beats: list[Heartbeat] = result["beats"]
    accuracy = [r["accuracy"] for r in everything[first_policy] if "accuracy" in r]
    out: dict[str, Any] = {
        "seconds": end - start,
        "steps": solver[-1]["step"],
        "t_train": step_seconds,
        "t_wait": wait_seconds,
        "rollout_tokens_per_second": sum(b.tokens_per_second for b in beats if b.role == "rollout"),
        "trainer_samples_per_second": batch / step_seconds if step_seconds > 0 else 0.0,
        "mean_staleness": statistics.mean(r.get("staleness", 0.0) for r in solver),
        "stale_dropped": sum(r.get("stale_dropped", 0) for r in solver),
        "final_accuracy": accuracy[-1] if accuracy else None,
    }
    for role in ("trainer", "rollout", "workflow"):
        idle = [b.idle_fraction for b in beats if b.role == role and b.idle_fraction is not None]
        out[f"idle_{role}"] = statistics.mean(idle) if idle else None
    return out


def run(*, quick: bool, simulated: bool = False) -> dict[str, Any]:
    """`simulated`: modelled generation and training instead (`pipeline_simulated`)."""
    if simulated:
        from polyrl.bench import pipeline_simulated

        return pipeline_simulated.run(quick=quick)
    base = jobfile.load(job_path())
    steps = QUICK_STEPS if quick else FULL_STEPS
    first = base.spec.policies[0]
    figures: dict[str, Any] = {"steps": steps, "job": base.metadata.name, "quick": quick}
    per_mode: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-pipeline-") as tmp:
        for mode in ("async", "sync"):
            job = variant(base, mode=mode, steps=steps, warmup=QUICK_WARMUP if quick else None)
            result = run_mode(job, Path(tmp) / mode)
            per_mode[mode] = mode_figures(result, first.name, first.trainer.batch_size)
    for mode, values in per_mode.items():
        figures |= {f"{mode}_{key}": value for key, value in values.items()}
    sync = per_mode["sync"]
    # Sync mode's trainer waits t_gen for each batch, then trains for t_train.
    t_gen, t_train = sync["t_wait"], sync["t_train"]
    ideal = (t_gen + t_train) / max(t_gen, t_train) if max(t_gen, t_train) > 0 else 1.0
    speedup = sync["seconds"] / per_mode["async"]["seconds"]
    figures |= {
        "t_gen": t_gen,
        "t_train": t_train,
        "ideal_speedup": ideal,
        "async_vs_sync_speedup": speedup,
        "speedup_vs_ideal": speedup / ideal,
    }
    return figures
