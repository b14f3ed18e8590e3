"""A benchmark part: one workflow runner in a process of its own (`polyrl bench scale`).

In a pod the workflow runner has a process to itself; in `polyrl bench scale` it must too,
or its CPU is mixed with the replicas' and whether one runner is the limit cannot be told.
This is the runner's own code (`runner.main.build_workflow`) started with the simulated
job's spec; SIGTERM stops it as it stops a pod, and it prints `{"failed": N}` (episodes that
failed) on its way out.

    python -m polyrl.bench.runner_process --url URL --namespace NS --job JOB --pod POD \
        --spec SPEC.json [--publish-window N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from polyrl.api.launch import Role, WorkerConfig
from polyrl.api.resources import RLJobSpec


async def serve(args: argparse.Namespace, spec: RLJobSpec) -> int:
    from polyrl.workers.runner import main as runner_main
    from polyrl.workers.runtime.window import PublishWindow
    from polyrl.workers.runtime.worker import Runtime

    config = WorkerConfig(namespace=args.namespace, job=args.job, role=Role.WORKFLOW,
                          policy=None, nats_url=args.url, spec=spec)  # fmt: skip
    rt = await Runtime.connect(config, args.pod)
    rt.install_signal_handlers()
    runner = runner_main.build_workflow(rt)
    if args.publish_window:
        before = runner.emission.window
        runner.emission.window = PublishWindow(args.publish_window, on_error=before.on_error)
    try:
        await runner.run()
    finally:
        await rt.close()
    return runner.failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--url", "--namespace", "--job", "--pod", "--spec"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--publish-window", type=int, default=0, help="0: the runner's own")
    args = parser.parse_args()
    spec = RLJobSpec.model_validate_json(Path(args.spec).read_text())
    failed = asyncio.run(serve(args, spec))
    print(json.dumps({"failed": failed}), flush=True)


if __name__ == "__main__":
    main()
