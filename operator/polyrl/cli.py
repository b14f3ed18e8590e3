"""The `polyrl` command: one entry point for users, operators and benchmarks.

Subcommands are registered in `_COMMANDS`; each is a small function taking the parsed
arguments and returning an exit code, so the CLI stays a thin layer over library code.
Heavy imports (torch, kopf) happen inside the subcommand that needs them, which keeps
`polyrl --help` instant and lets the operator image run without torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from polyrl._version import __version__

EXIT_USAGE = 2
EXIT_NOT_IMPLEMENTED = 3


def _run(args: argparse.Namespace) -> int:
    job: Path = args.job
    if not job.is_file():
        print(f"polyrl run: job file {job} does not exist", file=sys.stderr)
        return EXIT_USAGE
    print(
        "polyrl run: not implemented yet: the local runner arrives with the data-plane issue "
        f"(#4). {job} was not started.",
        file=sys.stderr,
    )
    return EXIT_NOT_IMPLEMENTED


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="run an RLJob on this machine (embedded nats-server, local processes)",
        description="Run the RLJob in JOB on this machine, without Kubernetes: an embedded "
        "nats-server and the same worker processes the operator would start as pods.",
    )
    p.add_argument("job", type=Path, metavar="JOB", help="an RLJob manifest (YAML)")
    p.set_defaults(func=_run)


_COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_run,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polyrl",
        description="Train several LLM policies together with asynchronous RL, "
        "natively on Kubernetes (`kubectl apply` an RLJob) or on one machine (`polyrl run`).",
    )
    parser.add_argument("--version", action="version", version=f"polyrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_USAGE
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
