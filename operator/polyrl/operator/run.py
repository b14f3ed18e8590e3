"""Starting the operator: `polyrl operator [--namespace NS ...] [--liveness URL]`.

Peering is on by default (`ClusterKopfPeering` named `polyrl`, installed by the chart), so
two operators never act at once; `--standalone` turns it off for development clusters
without the peering CRD. Each operator's peering priority is its start time, so the newest
one acts and older ones pause: a restarted operator (after a crash, a SIGKILL or an
upgrade) works at once, instead of pausing until the dead one's peering record expires, and
an operator started by mistake beside a running one takes over while the first waits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time

from prometheus_client import start_http_server

EXIT_STALE_CRDS = 3
EXIT_INSECURE = 2  # neither a signing Secret nor an explicit opt-in to shared NATS


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
        "--priority",
        type=int,
        default=None,
        help="peering priority (default: the start time in milliseconds, so the newest operator "
        "acts and older ones pause)",
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
    # When this operator pauses for a newer one, and when it resumes, is worth a log line.
    logging.getLogger("kopf._core.engines.peering").setLevel(logging.INFO)
    import kopf

    from polyrl.operator import crdcheck, kube, settings
    from polyrl.operator import main as handlers

    if refused := settings.problems(settings.OperatorSettings.from_env()):
        for why in refused:
            print(f"polyrl operator: {why}", file=sys.stderr)
        return EXIT_INSECURE
    api = kube.load_client()
    problems = crdcheck.mismatches(api)
    if problems:
        crdcheck.report(api, problems)
        return EXIT_STALE_CRDS

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
                priority=int(time.time() * 1000) if args.priority is None else args.priority,
                liveness_endpoint=args.liveness,
            )
        )
    del handlers
    return 0


if __name__ == "__main__":
    sys.exit(main())
