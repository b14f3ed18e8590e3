"""Starting the operator: `polyrl operator [--namespace NS ...] [--liveness URL]`.

Peering is on by default (`ClusterKopfPeering` named `polyrl`, installed by the chart), so an
accidental second operator pauses instead of fighting; `--standalone` turns it off for
development clusters without the peering CRD.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

from prometheus_client import start_http_server


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="polyrl operator",
        description="Run the polyrl operator (kopf): RLJobs become PolicyGroups, pods and NATS "
        "streams. Configuration comes from the environment (POLYRL_NATS_URL, "
        "POLYRL_NATS_CREDENTIALS_SECRET, POLYRL_WORKER_COMMAND, ...).",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    parser.add_argument("--standalone", action="store_true", help="no peering with other operators")
    parser.add_argument(
        "--peering", default="polyrl", help="ClusterKopfPeering name (default: polyrl)"
    )
    parser.add_argument(
        "--liveness", default=None, help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kopf").setLevel(logging.INFO if args.verbose else logging.WARNING)
    import kopf

    from polyrl.operator import main as handlers

    if args.metrics_port:
        start_http_server(args.metrics_port, addr="0.0.0.0")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            kopf.operator(
                registry=kopf.get_default_registry(),
                clusterwide=not args.namespace,
                namespaces=args.namespace,
                standalone=args.standalone,
                peering_name=None if args.standalone else args.peering,
                liveness_endpoint=args.liveness,
            )
        )
    del handlers
    return 0


if __name__ == "__main__":
    sys.exit(main())
