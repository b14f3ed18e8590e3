"""`polyrl worker publisher`: a frozen policy's model, put into the Object Store once.

A frozen policy (`frozen: true`: a judge, a reward model, a fixed opponent) has rollout
replicas and no trainer; its replicas still load from the policy's Object Store bucket, so a
remote pool needs no shared storage. This process does the part of a trainer's start that
they need: it loads the model as a trainer would, puts the bundle (config and tokenizer)
and version 0 (a keyframe) into the bucket, announces it, and exits 0. Run again (a
replaced pod, a resumed job) it finds version 0 announced and ends at once: one version is
all a frozen policy ever has. Its NATS user may do exactly this (`polyrl.api.access`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import torch

from polyrl.api.launch import WorkerConfig
from polyrl.api.resources import PolicySpec
from polyrl.workers import preflight
from polyrl.workers.errors import ConfigError
from polyrl.workers.models import loading as models
from polyrl.workers.runtime.worker import Runtime, torch_threads, workdir_for
from polyrl.workers.weightsync import announce, bundle
from polyrl.workers.weightsync.publish import WeightPublisher
from polyrl.workers.weightsync.store import WeightStore

log = logging.getLogger("polyrl.publisher")


def frozen_policy(config: WorkerConfig) -> PolicySpec:
    """The frozen policy this publisher is for; a trained one is a configuration error."""
    policy = config.spec.policy(config.policy or "")
    if policy is None:
        raise ConfigError(f"policy {config.policy!r} is not in the job's spec")
    if not policy.frozen:
        raise ConfigError(
            f"policy {policy.name!r} is trained: its trainer publishes it, not a publisher"
        )
    preflight.policy_model(policy)
    return policy


async def publish(rt: Runtime, policy: PolicySpec, workdir: Path) -> str:
    """Put `policy`'s bundle and version 0 into its bucket, unless it is there; says what
    it did."""
    last = await announce.latest(rt.js, rt.names, policy.name)
    if last is not None:
        return f"{policy.name}: version {last.version} is published already; nothing to do"
    torch.set_num_threads(torch_threads())
    model, tokenizer = await asyncio.to_thread(
        models.make_model, policy.model, cache_dir=workdir / "models"
    )
    size = await bundle.publish_exported(
        rt.js, rt.names, policy.name, lambda out: models.export(model, tokenizer, out)
    )
    state = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    store = await WeightStore.open(rt.js, rt.names.weights_bucket(policy.name))
    publisher = WeightPublisher(store, rt.names, policy.name, keyframe_every=1)
    await publisher.publish(state, 0)
    weights = sum(t.numel() * 2 for t in state.values())
    return (
        f"{policy.name}: published the model bundle ({size} bytes) and version 0 "
        f"({weights >> 20} MiB of bf16 weights); frozen: never trained"
    )


async def serve(config: WorkerConfig, pod: str) -> None:
    policy = frozen_policy(config)
    models.prepare(policy.model, cache_dir=workdir_for(config) / "models")
    rt = await Runtime.connect(config, pod)
    try:
        log.info("%s", await publish(rt, policy, workdir_for(config)))
    finally:
        await rt.close()
