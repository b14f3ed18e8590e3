"""`polyrl worker <role>`: the entry point of worker pods (and local processes).

One thin entry for the four processes (a frozen policy's `publisher` in `publisher.main`): `rollout` (built by `rollout.main`) and `workflow`
(`runner.main`) run here after connecting; a trainer pod runs `polyrl worker trainer torchrun
...`: its input is checked here, without torch, then torchrun takes over and runs
`python -m polyrl.workers.trainer` on every rank (`preflight.trainer_then`). Everything comes
from the environment (see `runtime.worker`); a bad environment exits 2 with a readable message,
so a misconfigured pod fails fast and says why.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING

from polyrl.workers import preflight
from polyrl.workers.errors import ConfigError, Stopped, Unavailable
from polyrl.workers.runtime.worker import Runtime, fail, load_config

if TYPE_CHECKING:
    from polyrl.workers.rollout.worker import RolloutWorker
    from polyrl.workers.runner.runner import WorkflowRunner

log = logging.getLogger("polyrl.worker")
EXIT_USAGE = 2


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
        if loaded is not None:  # the runner needs no torch: nothing of the rollout is imported
            from polyrl.workers.runner.main import build_workflow

            worker = build_workflow(rt, *loaded)
        else:
            from polyrl.workers.rollout.main import build_rollout

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
    if argv == ["publisher"]:
        return _publisher()
    if len(argv) != 1 or argv[0] not in ("rollout", "workflow"):
        print(
            "usage: polyrl worker rollout|workflow|publisher|trainer <launcher> [args...]\n"
            "  (trainer: checks the trainer's input, then runs the launcher: torchrun ...;\n"
            "   publisher: puts a frozen policy's model into the Object Store once)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        asyncio.run(serve(argv[0]))
    except (ConfigError, Unavailable) as err:
        return fail("polyrl worker", err)
    return 0


def _publisher() -> int:
    from polyrl.workers.publisher import main as publisher  # torch: only here

    try:
        config, pod = load_config()
        asyncio.run(publisher.serve(config, pod))
    except (ConfigError, Unavailable) as err:
        return fail("polyrl worker publisher", err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
