"""Building a rollout worker: the policy's model bundle and first weights, from NATS.

`polyrl worker rollout` (`polyrl.workers.main`) connects, then `build_rollout` fetches the
config and tokenizer the trainer published (`weightsync.bundle`), builds the model empty,
loads the latest announced weights into an engine and hands all of it to the `RolloutWorker`.
A pod asked to stop while it waits (deleted before its trainer published anything) ends at
once instead of at its grace period's end.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from polyrl.api.lora import LoraSync
from polyrl.api.resources import PolicySpec
from polyrl.workers.errors import ConfigError, Stopped
from polyrl.workers.models import prompts
from polyrl.workers.runtime.worker import Runtime, torch_threads
from polyrl.workers.weightsync import bundle
from polyrl.workers.weightsync.announce import BASE_OBJECT
from polyrl.workers.weightsync.store import WeightStore

if TYPE_CHECKING:
    from polyrl.workers.rollout.weights import EngineWeights
    from polyrl.workers.rollout.worker import ModelFacts, RolloutWorker

log = logging.getLogger("polyrl.worker")
T = TypeVar("T")


def engine_options(
    policy: PolicySpec, others: list[PolicySpec], *, adapters: bool
) -> dict[str, Any]:
    """What the policy's engine is built with beyond its model, device and batch size: vLLM's
    LoRA slots for every policy of the pool (`rollout.servedBy`), the torch engine's float32
    compute where `model.dtype` asks for it (over the bfloat16 weights weight sync carries)."""
    import torch

    options: dict[str, Any] = {}
    lora = policy.trainer.lora
    if adapters and lora is not None and policy.rollout.engine == "vllm":
        ranks = [lora.rank] + [p.trainer.lora.rank for p in others if p.trainer.lora]
        options |= {"max_lora_rank": max(ranks), "max_loras": len(ranks)}
    if policy.rollout.engine == "torch" and policy.model.dtype == "float32":
        options["compute_dtype"] = torch.float32
    return options


async def build_rollout(
    rt: Runtime, *, device: str = "cpu", bundle_timeout: float = 300.0
) -> RolloutWorker:
    """A rollout worker serving the policy's first published weights (`Stopped` if it is
    asked to stop before it has them).

    torch and transformers are imported here, not with the module: the workflow runner shares
    this entry point and needs neither, and on a machine running the whole job their import
    (some 20 s of CPU each) competes with the trainers' start.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from polyrl.workers.rollout.engines import make_engine
    from polyrl.workers.rollout.engines.base import ServesAdapters
    from polyrl.workers.rollout.weights import EngineWeights, read_base
    from polyrl.workers.rollout.worker import RolloutWorker

    torch.set_num_threads(torch_threads())
    spec = rt.config.spec
    policy = spec.policy(rt.config.policy or "")
    if policy is None:
        raise ConfigError(f"policy {rt.config.policy!r} is not in the job's spec")
    if policy.rollout.served_by is not None:
        raise ConfigError(
            f"policy {policy.name} is served by {policy.rollout.served_by}'s rollout pool "
            "(rollout.servedBy): it has no rollout workers of its own"
        )
    others = [p for name in spec.served_in_pool(policy.name)[1:] if (p := spec.policy(name))]
    scratch = Path(tempfile.mkdtemp(prefix="polyrl-model-"))
    try:
        directory = await until_stopped(
            rt, bundle.fetch(rt.js, rt.names, policy.name, scratch, timeout=bundle_timeout)
        )
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        # In bfloat16 whatever model.dtype says: it is what weight sync carries (`weights_dtype`).
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        facts = model_facts(directory, config, tokenizer)
    finally:  # the weights come from the weight store; the files are not needed again
        shutil.rmtree(scratch, ignore_errors=True)
    lora = policy.trainer.lora
    alpha = lora.scale_alpha if lora is not None and lora.sync == LoraSync.ADAPTER else None
    store = await WeightStore.open(rt.js, rt.names.weights_bucket(policy.name))
    if lora is not None and alpha is not None:  # the engine starts from the frozen base
        model.load_state_dict(await read_base(store, rt.stopping))
    engine = make_engine(
        str(policy.rollout.engine),
        model,
        device=device,
        max_batch_size=policy.rollout.max_batch_size,
        **engine_options(policy, others, adapters=alpha is not None),
    )
    if alpha is not None and not isinstance(engine, ServesAdapters):
        raise ConfigError(
            f"the {policy.rollout.engine} engine serves no LoRA adapters: "
            "set trainer.lora.sync: merged to send it merged weights"
        )
    log.info(
        "%s engine on %s (python environment %s)", policy.rollout.engine, engine.device, sys.prefix
    )
    weights = EngineWeights(
        rt.js,
        rt.names,
        policy.name,
        store,
        malformed=rt.malformed_announcements(policy.name),
        adapter_alpha=alpha,
    )
    # Version 0 is announced right after the bundle; poll NATS for it (nothing to wait on).
    while await weights.update(engine) is None and weights.version is None:
        if rt.stopping.is_set():
            raise Stopped("stopped before the first weights were announced")
        await asyncio.sleep(0.5)
    pool = await pool_sources(rt, store, others)
    return RolloutWorker(rt, engine, tokenizer, weights, model=facts, pool=pool)


async def pool_sources(
    rt: Runtime, own: WeightStore, others: list[PolicySpec]
) -> dict[str, EngineWeights]:
    """The weights of the other policies a shared pool serves, each checked against the
    base the engine holds (its own trainer's must be the same: `EngineWeights.pool_base`);
    they are served from their first announced adapter on."""
    from polyrl.workers.rollout.weights import EngineWeights

    if not others:
        return {}
    base = (await own.meta(BASE_OBJECT)).digest
    sources = {}
    for other in others:
        assert other.trainer.lora is not None  # the spec's servedBy check
        sources[other.name] = EngineWeights(
            rt.js,
            rt.names,
            other.name,
            await WeightStore.open(rt.js, rt.names.weights_bucket(other.name)),
            malformed=rt.malformed_announcements(other.name),
            adapter_alpha=other.trainer.lora.scale_alpha,
            pool_base=base,
        )
    log.info("a shared pool: serving %s beside %s", ", ".join(sources), rt.config.policy)
    return sources


async def until_stopped(rt: Runtime, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result; `Stopped` once the worker is asked to stop first (SIGTERM: a pod
    deleted while it waits for its model ends at once, not at its grace period's end)."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(rt.stopping.wait())
    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if task.done():
        return task.result()
    task.cancel()
    raise Stopped("stopped while waiting for the model bundle")


def model_facts(directory: Path, config: Any, tokenizer: Any) -> ModelFacts:
    """Stop ids (the tokenizer's EOS and every EOS the model's config and generation config
    list: an instruct model ends a turn with one, the base text with another), the model's
    vocabulary and its context."""
    from transformers import GenerationConfig

    from polyrl.workers.rollout.worker import ModelFacts

    stops: list[int] = []
    sources: list[Any] = [tokenizer.eos_token_id, getattr(config, "eos_token_id", None)]
    if (directory / "generation_config.json").exists():
        sources.append(GenerationConfig.from_pretrained(directory).eos_token_id)
    for value in sources:
        for token in value if isinstance(value, list) else [value]:
            if isinstance(token, int) and token not in stops:
                stops.append(token)
    text = getattr(config, "get_text_config", lambda: config)()
    vocab = int(getattr(text, "vocab_size", len(tokenizer)))
    return ModelFacts(tuple(stops), vocab, prompts.context_of(text.to_dict()))
