"""helm, built from its Go module, installs a chart into the test control plane."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from polyrl.testing import tools
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl


def test_helm_reports_its_pinned_version(helm_binary: Path) -> None:
    out = subprocess.run(
        [str(helm_binary), "version", "--short"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith(tools.HELM_VERSION)


def test_helm_installs_a_chart_into_the_cluster(
    helm_binary: Path, cluster: Cluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    chart = tmp_path / "smoke"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: smoke\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CACHE_HOME": str(tmp_path / "hc"),
        "HELM_CONFIG_HOME": str(tmp_path / "hcfg"),
        "HELM_DATA_HOME": str(tmp_path / "hd"),
    }
    subprocess.run(
        [
            str(helm_binary),
            "install",
            "demo",
            str(chart),
            "-n",
            namespace,
            "--set",
            "greeting=bonjour",
            "--wait",
            "--timeout",
            "60s",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    cm = kubectl.json("get", "configmap", "demo-cm", "-n", namespace)
    assert cm["data"] == {"greeting": "bonjour"}
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
