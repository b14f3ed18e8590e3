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

from polyrl.api.launch import Role
from polyrl.api.naming import JobNames
from polyrl.api.resources import RLJobSpec
from polyrl.bench import simulation


async def serve(args: argparse.Namespace, spec: RLJobSpec) -> int:
    names = JobNames(namespace=args.namespace, job=args.job)
    rt = await simulation.connect_worker(args.url, names, spec, Role.WORKFLOW, args.pod, None)
    rt.install_signal_handlers()
    runner = simulation.build_runner(rt, args.publish_window)
    try:
        await runner.run()
    finally:
        await rt.close()
    return int(runner.failed)


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
