"""`polyrl worker <role>`: the entry point of worker pods (and local processes).

Rollout and workflow workers run here. A trainer pod runs `polyrl worker trainer torchrun
...`: its input is checked here, without torch, then torchrun takes over and runs
`-m polyrl.workers.trainer` on every rank (`preflight.trainer_then`). Everything comes
from the environment (see `runtime`); a bad environment exits 2 with a readable message,
so a misconfigured pod fails fast and says why.
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

from polyrl.workers import bundle, preflight, prompts, tasks
from polyrl.workers.deltas.store import WeightStore
from polyrl.workers.errors import ConfigError, Stopped, Unavailable
from polyrl.workers.runtime import Runtime, fail, load_config, torch_threads
from polyrl.workers.workflow_runner import WorkflowRunner
from polyrl.workers.workflows import Workflow

if TYPE_CHECKING:
    from polyrl.workers.rollout import ModelFacts, RolloutWorker

log = logging.getLogger("polyrl.worker")
EXIT_USAGE = 2
T = TypeVar("T")


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

    from polyrl.workers.engines import make_engine
    from polyrl.workers.rollout import RolloutWorker
    from polyrl.workers.weights import EngineWeights

    torch.set_num_threads(torch_threads())
    policy = rt.config.spec.policy(rt.config.policy or "")
    if policy is None:
        raise ConfigError(f"policy {rt.config.policy!r} is not in the job's spec")
    scratch = Path(tempfile.mkdtemp(prefix="polyrl-model-"))
    try:
        directory = await until_stopped(
            rt, bundle.fetch(rt.js, rt.names, policy.name, scratch, timeout=bundle_timeout)
        )
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        model = AutoModelForCausalLM.from_config(config, dtype=policy.model.dtype)  # type: ignore[no-untyped-call]
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        facts = model_facts(directory, config, tokenizer)
    finally:  # the weights come from the weight store; the files are not needed again
        shutil.rmtree(scratch, ignore_errors=True)
    engine = make_engine(
        str(policy.rollout.engine),
        model,
        device=device,
        max_batch_size=policy.rollout.max_batch_size,
    )
    log.info(
        "%s engine on %s (python environment %s)", policy.rollout.engine, engine.device, sys.prefix
    )
    store = await WeightStore.open(rt.js, rt.names.weights_bucket(policy.name))
    weights = EngineWeights(
        rt.js, rt.names, policy.name, store, malformed=rt.malformed_announcements(policy.name)
    )
    # Version 0 is announced right after the bundle; poll NATS for it (nothing to wait on).
    while await weights.update(engine) is None and weights.version is None:
        if rt.stopping.is_set():
            raise Stopped("stopped before the first weights were announced")
        await asyncio.sleep(0.5)
    return RolloutWorker(rt, engine, tokenizer, weights, model=facts)


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

    from polyrl.workers.rollout import ModelFacts

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


def build_workflow(
    rt: Runtime, workflow: Workflow | None = None, task: tasks.Task | None = None
) -> WorkflowRunner:
    """The workflow runner, with the job's workflow and task unless given (loaded)."""
    if workflow is None or task is None:
        workflow, task = preflight.workflow_and_task(rt.config.spec)
    spec = rt.config.spec
    per_runner = max(1, spec.workflow.episodes_in_flight // spec.workflow.replicas)
    return WorkflowRunner(rt, workflow, task, concurrency=per_runner)


async def serve(role: str) -> None:
    config, pod = load_config()
    if str(config.role) != role:
        raise ConfigError(
            f"this worker was started as {role!r} but its config says {config.role!r}"
        )
    loaded = preflight.workflow_and_task(config.spec) if role == "workflow" else None
    rt = await Runtime.connect(config, pod)
    rt.install_signal_handlers()
    beat = asyncio.create_task(rt.heartbeat_forever())
    try:
        worker: RolloutWorker | WorkflowRunner
        if loaded is not None:
            worker = build_workflow(rt, *loaded)
        else:
            worker = await build_rollout(rt)
        await worker.run()
    except Stopped as err:
        log.info("%s", err)
    finally:
        beat.cancel()
        await rt.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if argv[:1] == ["trainer"]:
        return preflight.trainer_then(argv[1:])
    if len(argv) != 1 or argv[0] not in ("rollout", "workflow"):
        print(
            "usage: polyrl worker rollout|workflow|trainer <launcher> [args...]\n"
            "  (trainer: checks the trainer's input, then runs the launcher: torchrun ...)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        asyncio.run(serve(argv[0]))
    except (ConfigError, Unavailable) as err:
        return fail("polyrl worker", err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
