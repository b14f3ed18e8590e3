"""Where the Go-built tools live, and building them when they are missing.

The versions are pinned here and only here. Kubernetes v1.36 pairs with etcd v3.6.8 (the
version its own go.mod requires). Builds are cached under
`$POLYRL_CACHE` (default `~/.cache/polyrl`), in `tools/<name>-<version>/`, which counts only
once its `.complete` stamp exists; the build script writes into a temporary sibling and
renames it into place, so an interrupted build is never mistaken for a good one.

    python -m polyrl.testing.tools build     # build or reuse everything
    python -m polyrl.testing.tools versions  # print the versions of the cached binaries
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from polyrl.local.errors import StartupError

K8S_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.8"
HELM_VERSION = "v3.19.5"
# Kueue: the newest version the Go module proxy served when it was pinned. Built with its own
# go.mod's Kubernetes libraries; it talks to our API server over the stable APIs only.
KUEUE_VERSION = "v0.17.0"

COMPONENTS = ("etcd", "kubernetes", "helm", "kueue")


def cache_dir() -> Path:
    """The root of everything polyrl caches outside a clone."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "polyrl"
    return Path(os.environ.get("POLYRL_CACHE", default))


def tools_dir() -> Path:
    return cache_dir() / "tools"


def logs_dir() -> Path:
    return cache_dir() / "logs"


def component_dir(component: str) -> Path:
    version = {
        "etcd": ETCD_VERSION,
        "kubernetes": K8S_VERSION,
        "helm": HELM_VERSION,
        "kueue": KUEUE_VERSION,
    }[component]
    return tools_dir() / f"{component}-{version}"


def is_built(component: str) -> bool:
    return (component_dir(component) / ".complete").is_file()


@dataclass(frozen=True, slots=True)
class Tools:
    """Absolute paths of the binaries a control plane needs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    helm: Path | None
    kueue: Path | None = None  # the directory: `kueue` binary, `crd/`, `webhook/`

    @classmethod
    def from_cache(cls) -> Tools:
        k8s, etcd = component_dir("kubernetes"), component_dir("etcd")
        return cls(
            etcd=etcd / "etcd",
            kube_apiserver=k8s / "kube-apiserver",
            kube_controller_manager=k8s / "kube-controller-manager",
            kube_scheduler=k8s / "kube-scheduler",
            kubectl=k8s / "kubectl",
            helm=component_dir("helm") / "helm" if is_built("helm") else None,
            kueue=component_dir("kueue") if is_built("kueue") else None,
        )


def build(components: tuple[str, ...] = COMPONENTS, *, quiet: bool = False) -> None:
    """Build whatever is missing; raises StartupError naming the step and the log."""
    missing = [c for c in components if not is_built(c)]
    if not missing:
        return
    if shutil.which("go") is None:
        raise StartupError(
            "find Go toolchain", "'go' is not on PATH; Go >= 1.26 builds the control plane"
        )
    script = resources.files("polyrl.testing").joinpath("build-tools.sh")
    env = {
        **os.environ,
        "POLYRL_K8S_VERSION": K8S_VERSION,
        "POLYRL_ETCD_VERSION": ETCD_VERSION,
        "POLYRL_HELM_VERSION": HELM_VERSION,
        "POLYRL_KUEUE_VERSION": KUEUE_VERSION,
        "POLYRL_TOOLS_DIR": str(tools_dir()),
        "POLYRL_LOGS_DIR": str(logs_dir()),
    }
    for component in missing:
        started = time.monotonic()
        proc = subprocess.run(
            ["bash", str(script), component],
            env=env,
            stdout=subprocess.DEVNULL if quiet else None,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            log = (
                logs_dir()
                / f"build-{component}-{component_dir(component).name.split('-', 1)[1]}.log"
            )
            raise StartupError(
                f"build {component}",
                proc.stderr.strip().splitlines()[0]
                if proc.stderr.strip()
                else f"exit {proc.returncode}",
                log,
            )
        if not quiet:
            print(f"built {component} in {time.monotonic() - started:.0f} s", file=sys.stderr)


def ensure(*, with_helm: bool = False, with_kueue: bool = False) -> Tools:
    """The tools, built first if needed (a cold build takes tens of minutes on 2 cores)."""
    wanted = ("etcd", "kubernetes") + ("helm",) * with_helm + ("kueue",) * with_kueue
    build(wanted)
    return Tools.from_cache()


def versions(tools: Tools) -> dict[str, str]:
    """What each cached binary says about itself (for closing notes and bug reports)."""

    def first_line(*cmd: str | Path) -> str:
        out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False)
        return (out.stdout or out.stderr).strip().splitlines()[0]

    found = {
        "etcd": first_line(tools.etcd, "--version"),
        "kube-apiserver": first_line(tools.kube_apiserver, "--version"),
        "kube-controller-manager": first_line(tools.kube_controller_manager, "--version"),
        "kube-scheduler": first_line(tools.kube_scheduler, "--version"),
        "kubectl": first_line(tools.kubectl, "version", "--client"),
    }
    if tools.helm is not None:
        found["helm"] = first_line(tools.helm, "version", "--short")
    if tools.kueue is not None:
        found["kueue"] = KUEUE_VERSION  # its binary has no --version flag
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m polyrl.testing.tools",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["build", "versions", "path"])
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build()
        elif args.command == "path":
            print(tools_dir())
        else:
            built = ensure(with_helm=is_built("helm"), with_kueue=is_built("kueue"))
            for name, line in versions(built).items():
                print(f"{name}: {line}")
    except StartupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
