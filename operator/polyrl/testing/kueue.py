"""A real Kueue on a test control plane: its controller, CRDs and webhooks, reachable on loopback.

Kueue is built from its Go module like Kubernetes (`polyrl.testing.tools`, cached by version;
its main package reads one path from the environment, see build-tools.sh) and run as a local
process with the admin kubeconfig. Its usual install puts the controller
behind a Service and lets it issue its own webhook certificate; here nothing resolves a
Service, so internal certificate management is off, the control plane's CA signs a serving
certificate for 127.0.0.1, and every webhook's and CRD conversion's `clientConfig` is
rewritten from Kueue's Service to a loopback URL with that CA as its bundle.

What is left out on purpose:
- Only the webhooks of Kueue's own kinds and of pods are registered (the `pod` integration is
  the one polyrl uses); a registered webhook for an integration Kueue does not run would
  refuse every object of that kind.
- The pod webhooks act only in namespaces labelled `kueue.polyrl.dev/managed=true`, the same
  selector as Kueue's `managedJobsNamespaceSelector`, so the rest of a shared test cluster
  never calls Kueue (and keeps working when it stops).
- The visibility API is off (feature gate `VisibilityOnDemand`): its APIService without a
  reachable backend would break discovery for kubectl and kopf.

`stop()` removes the webhook configurations before it stops the process, for the same reason.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from polyrl.local import processes
from polyrl.local.errors import StartupError
from polyrl.testing import pki

NAMESPACE = "kueue-system"
MANAGED_LABEL = "kueue.polyrl.dev/managed"
WEBHOOK_CONFIGS = ("mutating-webhook-configuration", "validating-webhook-configuration")
KUEUE_GROUP = "kueue.x-k8s.io"


class Kueue:
    """Start with `start()` after the control plane, end with `stop()` before it."""

    def __init__(
        self,
        workdir: Path,
        *,
        kueue_dir: Path,
        kubectl: Path,
        kubeconfig: Path,
        ca: pki.KeyPair,
        wait_for_pods_ready: dict[str, Any] | None = None,
        ready_timeout: float = 90.0,
    ) -> None:
        self.workdir = workdir
        self.kueue_dir = kueue_dir
        self.kubectl = kubectl
        self.kubeconfig = kubeconfig
        self.ca = ca
        self.wait_for_pods_ready = wait_for_pods_ready
        self.ready_timeout = ready_timeout
        self.proc: processes.Managed | None = None
        self.webhook_port = 0
        self.timings: dict[str, float] = {}

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}"

    def __enter__(self) -> Kueue:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        started = time.monotonic()
        try:
            self.webhook_port = processes.free_port()
            pki.serving(self.workdir / "certs", self.ca, common="kueue-webhook")
            self._apply(crds(self.kueue_dir, url=self.url, ca_bundle=self._bundle()))
            self._wait_established()
            self._apply(
                [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
            )
            self._launch()
            self._apply(webhooks(self.kueue_dir, url=self.url, ca_bundle=self._bundle()))
            self._wait_webhooks()
        except BaseException:
            self.stop()
            raise
        self.timings["kueue"] = time.monotonic() - started

    def stop(self) -> None:
        for name in WEBHOOK_CONFIGS:
            kind = (
                "mutatingwebhookconfiguration"
                if "mutating" in name
                else ("validatingwebhookconfiguration")
            )
            self._kubectl("delete", kind, name, "--ignore-not-found", check=False)
        if self.proc is not None:
            processes.stop(self.proc)
            self.proc = None

    def restart(self, *, wait_for_pods_ready: dict[str, Any] | None = None) -> None:
        """Start again with another `waitForPodsReady` (Kueue reads it once, at start-up,
        for all its queues). Its objects stay: admitted Workloads stay admitted."""
        self.stop()
        self.wait_for_pods_ready = wait_for_pods_ready
        self.start()

    def _bundle(self) -> str:
        return base64.b64encode(self.ca.cert.read_bytes()).decode()

    def _launch(self) -> None:
        config_file = self.workdir / "kueue-config.yaml"
        health = processes.free_port()
        config_file.write_text(
            yaml.safe_dump(
                configuration(
                    webhook_port=self.webhook_port,
                    cert_dir=self.workdir / "certs",
                    health_port=health,
                    wait_for_pods_ready=self.wait_for_pods_ready,
                )
            )
        )
        binary = self.kueue_dir / "kueue"
        if not binary.is_file():
            raise StartupError("kueue: find binary", f"{binary} does not exist (make tools)")
        self.proc = processes.start(
            "kueue",
            [
                binary,
                f"--config={config_file}",
                f"--kubeconfig={self.kubeconfig}",
                "--zap-log-level=2",
            ],
            log=self.workdir / "logs" / "kueue.log",
            # Its metrics server is off, but it loads a certificate for it all the same
            # (from here: polyrl's one change to Kueue's main, in build-tools.sh).
            env={**os.environ, "KUEUE_METRICS_CERT_DIR": str(self.workdir / "certs")},
        )
        self._wait("kueue: wait for /readyz", lambda: _ready(f"http://127.0.0.1:{health}/readyz"))

    def _wait_established(self) -> None:
        names = [doc["metadata"]["name"] for doc in crds(self.kueue_dir, url="", ca_bundle="")]
        self._kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *[f"crd/{name}" for name in names],
        )

    def _wait_webhooks(self) -> None:
        """A server-side dry run goes through Kueue's webhooks: it passes once the API server
        reaches them over TLS with the bundle it was given."""
        flavor = {
            "apiVersion": f"{KUEUE_GROUP}/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "polyrl-webhook-probe"},
        }

        def answers() -> bool:
            out = self._kubectl(
                "create", "--dry-run=server", "-f", "-", stdin=json.dumps(flavor), check=False
            )
            return out.returncode == 0

        self._wait("kueue: wait for its webhooks to answer the API server", answers)

    def _wait(self, step: str, ready: Any) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc is not None and not self.proc.alive():
                reason = f"kueue exited during start-up:\n{processes.tail(self.proc.log)}"
                raise StartupError(step, reason, self.proc.log)
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.3)
        log = self.proc.log if self.proc is not None else None
        raise StartupError(step, f"not ready after {self.ready_timeout:.0f}s", log)

    def _apply(self, docs: list[dict[str, Any]]) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        self._kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=body)

    def _kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and out.returncode != 0:
            raise StartupError(f"kueue: kubectl {args[0]}", out.stderr.strip())
        return out


def configuration(
    *,
    webhook_port: int,
    cert_dir: Path,
    health_port: int,
    wait_for_pods_ready: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Kueue's Configuration for a loopback control plane: one replica without leader
    election, certificates from `cert_dir`, the pod integration in managed namespaces."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchLabels": {MANAGED_LABEL: "true"}},
        "integrations": {"frameworks": ["pod"]},
        "featureGates": {"VisibilityOnDemand": False},
    }
    if wait_for_pods_ready is not None:
        config["waitForPodsReady"] = wait_for_pods_ready
    return config


def crds(kueue_dir: Path, *, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's CRDs as its kustomization lists them, with the conversion webhooks its patches
    add pointed at `url`."""
    base = kueue_dir / "crd"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    converted = set()
    for patch in kustomization.get("patches", []):
        doc = yaml.safe_load((base / patch["path"]).read_text())
        if doc.get("spec", {}).get("conversion", {}).get("strategy") == "Webhook":
            converted.add(doc["metadata"]["name"])
    docs = []
    for resource in kustomization["resources"]:
        doc = yaml.safe_load((base / resource).read_text())
        if doc["metadata"]["name"] in converted:
            doc["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"{url}/convert", "caBundle": ca_bundle},
                    "conversionReviewVersions": ["v1"],
                },
            }
        docs.append(doc)
    return docs


def webhooks(kueue_dir: Path, *, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, only for its own kinds and pods, each called at
    `url` + its path; the pod webhooks only in namespaces labelled MANAGED_LABEL."""
    docs = []
    for doc in yaml.safe_load_all((kueue_dir / "webhook" / "manifests.yaml").read_text()):
        if not doc:
            continue
        kept = []
        for hook in doc["webhooks"]:
            groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
            resources = {r for rule in hook["rules"] for r in rule["resources"]}
            pods = groups == {""} and resources == {"pods"}
            if not (pods or groups == {KUEUE_GROUP}):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca_bundle}
            if pods:
                hook["namespaceSelector"] = {"matchLabels": {MANAGED_LABEL: "true"}}
            kept.append(hook)
        docs.append({**doc, "webhooks": kept})
    return docs


def _ready(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError:
        return False


def queues(
    namespace: str,
    *,
    cpu: int,
    memory: str = "64Gi",
    flavor: str = "default-flavor",
    node_labels: str = "{}",
    preemption: bool = False,
) -> str:
    """Manifests for one namespace's quota: a ResourceFlavor (its node labels, as YAML), a
    ClusterQueue `cq-<namespace>` with `cpu` cores and `memory` (preempting lower priorities
    where asked) serving only that namespace, and the LocalQueue `work` in it."""
    preempt = "\n  preemption: {withinClusterQueue: LowerPriority}" if preemption else ""
    return f"""
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {{name: {flavor}}}
spec: {{nodeLabels: {node_labels}}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {{name: cq-{namespace}}}
spec:
  namespaceSelector:
    matchLabels: {{kubernetes.io/metadata.name: {namespace}}}{preempt}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: {flavor}
      resources:
      - {{name: cpu, nominalQuota: {cpu}}}
      - {{name: memory, nominalQuota: {memory}}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {{namespace: {namespace}, name: work}}
spec: {{clusterQueue: cq-{namespace}}}
"""
