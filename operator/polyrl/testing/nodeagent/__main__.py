"""python -m polyrl.testing.nodeagent --kubeconfig K --node NAME[,label=value...] [--mode exec]"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

from kubernetes import config

from polyrl.testing.nodeagent import agent, nodes


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m polyrl.testing.nodeagent",
        description="Register nodes, keep them Ready and act as their kubelet "
        "(a test fake: no container runtime).",
    )
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument(
        "--node",
        action="append",
        type=nodes.NodeSpec.parse,
        default=[],
        help="NAME[,label=value,...,capacity.RESOURCE=QTY]; repeat for more nodes",
    )
    parser.add_argument(
        "--mode",
        choices=agent.MODES,
        default="status",
        help="exec runs pod commands as processes; status only marks pods "
        "Running (default); namespaces override with label "
        f"{agent.MODE_LABEL}",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where pod sandboxes and logs go (default: a temp dir)",
    )
    parser.add_argument("--kube-version", default="v1.36.3")
    parser.add_argument("--lease-interval", type=float, default=10.0)
    parser.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="PATH",
        help="a host path every pod sees even under its volumes (repeatable; the agent's "
        "Python environment and working directory are always kept)",
    )
    parser.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="NAME",
        help="an environment variable of the agent's that pods inherit (repeatable; "
        "by default pods see only PATH and what the kubelet sets)",
    )
    parser.add_argument(
        "--image-env",
        action="append",
        default=[],
        metavar="IMAGE=DIR",
        help="run containers of IMAGE (any tag) with the Python environment DIR's bin first on "
        "PATH: the agent has no images, so this stands in for one whose software differs "
        "from the agent's own (the vLLM worker image; repeatable)",
    )
    parser.add_argument(
        "--token-max-age",
        type=float,
        default=24 * 3600.0,
        help="re-request a pod's service-account token once it is this old (seconds), "
        "or after 80%% of its lifetime, whichever comes first",
    )
    parser.add_argument(
        "--volume-sync",
        type=float,
        default=10.0,
        help="seconds between re-syncs of ConfigMap, Secret and token volumes",
    )
    args = parser.parse_args(argv)
    if not args.node:
        args.node = [nodes.NodeSpec(name="polyrl-node-0")]
    return args


def python_paths(extra: list[str]) -> tuple[str, ...]:
    """Host paths pods must keep seeing: this interpreter's prefixes and import path (the
    virtualenv, editable source roots), the working directory, and `extra`."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.getcwd(), *extra}
    found.update(p for p in sys.path if p and os.path.isdir(p))
    return tuple(sorted({os.path.realpath(p) for p in found}))


def image_envs(pairs: list[str]) -> dict[str, str]:
    """`--image-env IMAGE=DIR` pairs as a mapping; DIR must be a Python environment."""
    found = {}
    for pair in pairs:
        image, sep, env = pair.partition("=")
        if not sep or not image or not (Path(env) / "bin").is_dir():
            raise SystemExit(f"--image-env {pair!r}: expected IMAGE=DIR with DIR/bin present")
        found[image] = os.path.realpath(env)
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="polyrl-nodeagent-"))
    api = config.new_client_from_config(config_file=str(args.kubeconfig))
    images = image_envs(args.image_env)
    node_agent = agent.Agent(
        api,
        nodes_=args.node,
        mode=args.mode,
        workdir=workdir,
        kube_version=args.kube_version,
        lease_interval=args.lease_interval,
        keep=python_paths([*args.keep, *images.values()]),
        token_max_age=args.token_max_age,
        volume_sync=args.volume_sync,
        pass_env={k: os.environ[k] for k in args.pass_env if k in os.environ},
        images=images,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    with contextlib.suppress(KeyboardInterrupt):
        node_agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
