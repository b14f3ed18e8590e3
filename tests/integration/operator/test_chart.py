"""The Helm chart (charts/polyrl) and its plain-YAML copy (manifests/) are right and install.

Rendering tests need only helm; the install tests use the session's real control plane,
whose node agent marks the operator pod Running and Ready (the image is never pulled).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from polyrl.api import naming
from polyrl.testing import charts
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "polyrl"

# (apiGroup, resource, verb): exactly what the operator uses, and nothing else.
OPERATOR_RULES = [
    (
        ["polyrl.dev"],
        ["rljobs", "policygroups"],
        ["get", "list", "watch", "create", "update", "patch", "delete"],
    ),
    (["polyrl.dev"], ["rljobs/status", "policygroups/status"], ["get", "update", "patch"]),
    ([""], ["pods", "services"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
    ([""], ["persistentvolumeclaims"], ["create"]),
    ([""], ["events"], ["create", "patch"]),
    (["events.k8s.io"], ["events"], ["create", "patch"]),
    ([""], ["secrets"], ["get", "create", "patch"]),
    ([""], ["namespaces"], ["list", "watch"]),
    (["kueue.x-k8s.io"], ["workloads"], ["get"]),  # a queued job's Admitted condition
    (["apiextensions.k8s.io"], ["customresourcedefinitions"], ["list", "watch"]),
    (["kopf.dev"], ["clusterkopfpeerings"], ["get", "list", "watch", "patch"]),
]


def triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


EXPECTED_TRIPLES = triples(
    [{"apiGroups": g, "resources": r, "verbs": v} for g, r, v in OPERATOR_RULES]
)


def helm_env(home: Path, kubeconfig: Path | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env


def run_helm(
    helm: Path, *args: str, env: dict[str, str], check: bool = True, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(helm), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(helm: Path, values: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    return docs(charts.render(helm, CHART, values=values, **kw))


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def operator_env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    container = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# --- the chart itself -------------------------------------------------------------------


def test_the_chart_reads_the_generated_crds_through_a_relative_symlink() -> None:
    link = CHART / "crds"
    assert link.is_symlink(), "charts/polyrl/crds must be a symlink to ../../crds"
    assert os.readlink(link) == "../../crds"
    assert link.resolve() == (ROOT / "crds").resolve()


def test_helm_template_includes_every_generated_crd_unchanged(helm_binary: Path) -> None:
    rendered = [
        o for o in render(helm_binary, include_crds=True) if o["kind"] == "CustomResourceDefinition"
    ]
    generated = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
    assert {o["metadata"]["name"]: o for o in rendered} == {
        o["metadata"]["name"]: o for o in generated
    }


@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint-strict"])
def test_helm_lint_passes(helm_binary: Path, tmp_path: Path, strict: bool) -> None:
    args = ["lint", str(CHART), *(["--strict"] if strict else [])]
    proc = run_helm(helm_binary, *args, env=helm_env(tmp_path))
    assert "0 chart(s) failed" in proc.stdout


def test_the_chart_renders_one_operator_deployment_with_one_replica_and_recreate(
    helm_binary: Path,
) -> None:
    objects = render(helm_binary)
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    container = only([{"kind": "c", **c} for c in pod["containers"]], "c")
    assert container["image"] == "ghcr.io/polyrl/operator:0.1.0"
    assert container["command"] == ["polyrl", "operator", "--all-namespaces"]
    assert container["args"] == [
        "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9300",
    ]  # fmt: skip
    assert {"name": "metrics", "containerPort": 9300, "protocol": "TCP"} in container["ports"]
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert probe["port"] in ("http", 8080)
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert pod["serviceAccountName"] == "polyrl-operator"
    assert operator_env(objects)["POLYRL_NATS_URL"] == "nats://nats.nats.svc:4222"
    # The operator's own namespace, where it reads the NATS credentials Secret.
    assert operator_env(objects)["POLYRL_NAMESPACE"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    assert {o["kind"] for o in objects} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "ClusterKopfPeering",
        "Service",  # the operator's metrics
    }


def test_the_operator_pod_is_set_up_for_pod_security_restricted(helm_binary: Path) -> None:
    pod = only(render(helm_binary), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = pod["containers"][0]["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts == {"tmp": "/tmp"}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}


def test_the_cluster_role_grants_exactly_the_verbs_the_operator_uses(helm_binary: Path) -> None:
    objects = render(helm_binary)
    role = only(objects, "ClusterRole")
    assert triples(role["rules"]) == EXPECTED_TRIPLES
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
    binding = only(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "polyrl-operator", "namespace": "polyrl-system"}
    ]


def test_the_peering_object_lets_a_second_operator_pause(helm_binary: Path) -> None:
    peering = only(render(helm_binary), "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert peering["metadata"]["name"] == "polyrl"


def test_cluster_wide_names_are_release_specific(helm_binary: Path) -> None:
    objects = render(helm_binary, release="team-a", namespace="ns-a")
    assert only(objects, "ClusterRole")["metadata"]["name"] == "team-a-polyrl-operator"
    assert only(objects, "ClusterRoleBinding")["metadata"]["name"] == "team-a-polyrl-operator"


def test_deploying_nats_adds_a_statefulset_and_points_the_operator_at_it(
    helm_binary: Path,
) -> None:
    assert not [o for o in render(helm_binary) if o["kind"] == "StatefulSet"]
    objects = render(
        helm_binary,
        {"nats": {"deploy": True, "insecure": True, "storage": "3Gi"}, "metrics": {"port": 0}},
        release="demo",
        namespace="ml",
    )
    nats = only(objects, "StatefulSet")
    service = only(objects, "Service")
    assert nats["metadata"]["name"] == service["metadata"]["name"] == "demo-nats"
    container = nats["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "nats:2.10-alpine"
    assert container["args"] == ["-js", "-sd", "/data"]
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    (claim,) = nats["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "3Gi"
    assert service["spec"]["selector"] == nats["spec"]["selector"]["matchLabels"]
    assert [p["port"] for p in service["spec"]["ports"]] == [4222]
    assert operator_env(objects)["POLYRL_NATS_URL"] == "nats://demo-nats.ml.svc:4222"


def test_the_credentials_secret_appears_only_as_a_secret_name(helm_binary: Path) -> None:
    assert "POLYRL_NATS_CREDENTIALS_SECRET" not in operator_env(render(helm_binary))
    secret = "nats-creds-7f3a"
    text = charts.render(helm_binary, CHART, values={"nats": {"credentialsSecret": secret}})
    objects = docs(text)
    assert operator_env(objects)["POLYRL_NATS_CREDENTIALS_SECRET"] == secret
    assert text.count(secret) == 1, "the secret's name must appear in that env var only"
    assert not [o for o in objects if o["kind"] == "Secret"]
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert "secret" not in str(pod["volumes"]).lower()
    for env in pod["containers"][0]["env"]:
        assert "secretKeyRef" not in env.get("valueFrom", {})


def test_by_default_the_operator_signs_users_with_the_secret_nats_trust_writes(
    helm_binary: Path,
) -> None:
    env = operator_env(render(helm_binary))
    assert env["POLYRL_NATS_SIGNING_SECRET"] == "polyrl-nats-signing"  # `polyrl nats-trust`'s
    assert env["POLYRL_NATS_USER_TTL"] == "86400"
    assert "POLYRL_NATS_INSECURE" not in env
    env = operator_env(render(helm_binary, values={"nats": {"signingSecret": "signing"}}))
    assert env["POLYRL_NATS_SIGNING_SECRET"] == "signing"
    values = {"nats": {"signingSecret": "signing", "userTTLSeconds": 3600}}
    assert operator_env(render(helm_binary, values=values))["POLYRL_NATS_USER_TTL"] == "3600"


def test_an_open_nats_is_an_explicit_opt_in_and_anything_else_is_refused(
    helm_binary: Path,
) -> None:
    env = operator_env(render(helm_binary, values={"nats": {"insecure": True}}))
    assert env["POLYRL_NATS_INSECURE"] == "true"
    assert "POLYRL_NATS_SIGNING_SECRET" not in env
    with pytest.raises(RuntimeError, match=r"nats\.signingSecret is empty: name the Secret"):
        render(helm_binary, values={"nats": {"signingSecret": ""}})
    with pytest.raises(
        RuntimeError, match=r"nats\.deploy runs a NATS server without authentication"
    ):
        render(helm_binary, values={"nats": {"deploy": True}})


def test_the_worker_image_and_image_tag_are_passed_through(helm_binary: Path) -> None:
    assert "POLYRL_DEFAULT_WORKER_IMAGE" not in operator_env(render(helm_binary))
    objects = render(
        helm_binary,
        {
            "workerImage": "registry.local/worker:7",
            "image": {"tag": "dev", "repository": "registry.local/op"},
            "nodeSelector": {"pool": "cpu"},
            "serviceAccount": {"name": "robot"},
        },
    )
    assert operator_env(objects)["POLYRL_DEFAULT_WORKER_IMAGE"] == "registry.local/worker:7"
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.local/op:dev"
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["serviceAccountName"] == "robot"
    assert only(objects, "ServiceAccount")["metadata"]["name"] == "robot"
    assert only(objects, "ClusterRoleBinding")["subjects"][0]["name"] == "robot"


# --- metrics and network policy ------------------------------------------------------


def test_metrics_are_served_on_a_port_a_service_names_and_can_be_turned_off(
    helm_binary: Path,
) -> None:
    objects = render(helm_binary)
    service = only(objects, "Service")
    assert service["metadata"]["name"] == "polyrl-operator-metrics"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9300, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod = only(objects, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    off = render(helm_binary, {"metrics": {"port": 0}})
    assert not [o for o in off if o["kind"] == "Service"]
    container = only(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--metrics-port" not in container["args"]
    assert [p["name"] for p in container["ports"]] == ["http"]


def test_monitors_and_the_dashboard_are_optional_and_scrape_every_worker(
    helm_binary: Path,
) -> None:
    assert not [
        o for o in render(helm_binary) if o["kind"] in ("ServiceMonitor", "PodMonitor", "ConfigMap")
    ]
    values = {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}, "interval": "15s"},
            "dashboard": {"enabled": True},
        }
    }
    objects = render(helm_binary, values)
    monitor, workers = only(objects, "ServiceMonitor"), only(objects, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == workers["metadata"]["labels"]["release"]
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "interval": "15s"}]
    service = only(objects, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    # Worker pods in every namespace, by the label and port the operator gives them.
    assert workers["spec"]["namespaceSelector"] == {"any": True}
    assert workers["spec"]["selector"]["matchLabels"] == {naming.L_MANAGED_BY: naming.MANAGED_BY}
    assert workers["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    dashboard = only(objects, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (CHART / "dashboards" / "polyrl.json").read_text()
    assert json.loads(dashboard["data"]["polyrl.json"]) == json.loads(shipped)


def policies(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]
        for o in objects
        if o["kind"] == "NetworkPolicy"
    }


def test_network_policies_are_off_by_default_and_per_job_namespace_when_on(
    helm_binary: Path,
) -> None:
    assert not policies(render(helm_binary))
    values = {"networkPolicy": {"enabled": True, "jobNamespaces": ["team-a", "team-b"]}}
    found = policies(render(helm_binary, values))
    assert set(found) == {
        ("team-a", "polyrl-workers"), ("team-a", "polyrl-trainer-gang"),
        ("team-b", "polyrl-workers"), ("team-b", "polyrl-trainer-gang"),
        ("polyrl-system", "polyrl-operator"),
    }  # fmt: skip
    workers = found[("team-a", "polyrl-workers")]
    assert workers["podSelector"] == {"matchLabels": {naming.L_MANAGED_BY: naming.MANAGED_BY}}
    assert workers["policyTypes"] == ["Ingress", "Egress"]
    # Egress: NATS and DNS, nothing else.
    nats, dns = workers["egress"]
    assert nats["ports"] == [{"port": 4222, "protocol": "TCP"}]
    assert nats["to"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "nats"}}
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    # Ingress: the metrics port, from the Prometheus selector only.
    (scrape,) = workers["ingress"]
    assert scrape["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert scrape["from"][0]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "prometheus"}
    }
    # Trainer ranks reach each other, and only trainer ranks.
    gang = found[("team-a", "polyrl-trainer-gang")]
    trainers = {"matchLabels": {naming.L_MANAGED_BY: naming.MANAGED_BY, naming.L_ROLE: "trainer"}}
    assert gang["podSelector"] == trainers
    assert gang["ingress"] == [{"from": [{"podSelector": trainers}]}]
    assert gang["egress"] == [{"to": [{"podSelector": trainers}]}]
    operator = found[("polyrl-system", "polyrl-operator")]
    assert {p["port"] for p in operator["egress"][0]["ports"]} == {443, 6443}


def test_with_the_charts_nats_the_policies_point_at_it_and_it_admits_only_polyrl(
    helm_binary: Path,
) -> None:
    values = {
        "nats": {"deploy": True, "insecure": True},
        "networkPolicy": {
            "enabled": True,
            "jobNamespaces": ["team-a"],
            # Helm merges maps with the defaults: null drops a default key.
            "prometheus": {
                "namespaceSelector": {"matchLabels": None},
                "podSelector": {"matchLabels": {"p": "1", "app.kubernetes.io/name": None}},
            },
        },
    }
    objects = render(helm_binary, values, release="demo", namespace="ml")
    found = policies(objects)
    nats_pod = only(objects, "StatefulSet")["spec"]["selector"]["matchLabels"]
    egress = found[("team-a", "demo-polyrl-workers")]["egress"][0]["to"][0]
    assert egress == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ml"}},
        "podSelector": {"matchLabels": nats_pod},
    }
    ingress = found[("ml", "demo-nats")]["ingress"][0]
    assert ingress["ports"] == [{"port": 4222, "protocol": "TCP"}]
    assert ingress["from"][1] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}},
        "podSelector": {"matchLabels": {naming.L_MANAGED_BY: naming.MANAGED_BY}},
    }
    scrape = found[("team-a", "demo-polyrl-workers")]["ingress"][0]["from"][0]
    assert scrape == {"namespaceSelector": {}, "podSelector": {"matchLabels": {"p": "1"}}}


def test_the_api_server_accepts_the_network_policies(
    helm_binary: Path, kubectl: Kubectl, namespace: str
) -> None:
    values = {
        "nats": {"deploy": True, "insecure": True},
        "networkPolicy": {"enabled": True, "jobNamespaces": [namespace]},
    }
    objects = render(helm_binary, values, namespace=namespace)
    made = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert len(made) == 4
    text = yaml.safe_dump_all(made)
    proc = kubectl("create", "--dry-run=server", "-f", "-", input=text, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("networkpolicy.networking.k8s.io") == 4, proc.stdout


# --- manifests/ -------------------------------------------------------------------------


def test_manifests_polyrl_yaml_is_the_chart_rendered_now(helm_binary: Path) -> None:
    expected = charts.manifest_text(helm_binary, CHART)
    current = (ROOT / "manifests" / "polyrl.yaml").read_text()
    assert current == expected, (
        f"manifests/polyrl.yaml is stale; regenerate it with `{charts.REGENERATE}`"
    )
    assert current.splitlines()[0].startswith("# Generated")
    assert "CustomResourceDefinition" not in current


def test_manifests_namespace_yaml_creates_the_namespace_polyrl_yaml_uses() -> None:
    (namespace,) = docs((ROOT / "manifests" / "namespace.yaml").read_text())
    assert namespace["kind"] == "Namespace"
    assert namespace["metadata"]["name"] == charts.NAMESPACE == "polyrl-system"
    objects = docs((ROOT / "manifests" / "polyrl.yaml").read_text())
    assert {o["metadata"].get("namespace") for o in objects} <= {None, "polyrl-system"}


# --- on the test control plane --------------------------------------------------------


@pytest.fixture
def restricted_namespace(kubectl: Kubectl, namespace: str) -> str:
    """The fresh namespace, with Pod Security "restricted" enforced."""
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    return namespace


@pytest.fixture
def installed(
    helm_binary: Path, cluster: Cluster, restricted_namespace: str, tmp_path: Path
) -> Iterator[tuple[str, dict[str, str]]]:
    release = f"polyrl-{restricted_namespace}"
    env = helm_env(tmp_path, cluster.kubeconfig)
    # Helm creates the CRDs from crds/ or, where another test made them already, skips them.
    run_helm(
        helm_binary,
        "install",
        release,
        str(CHART),
        "-n",
        restricted_namespace,
        "--wait",
        "--timeout",
        "90s",
        env=env,
    )
    yield release, env
    run_helm(
        helm_binary,
        "uninstall",
        release,
        "-n",
        restricted_namespace,
        "--wait",
        env=env,
        check=False,
    )


def test_helm_installs_the_operator_under_pod_security_restricted_and_uninstalls_it(
    helm_binary: Path,
    kubectl: Kubectl,
    restricted_namespace: str,
    installed: tuple[str, dict[str, str]],
) -> None:
    release, env = installed
    ns = restricted_namespace
    name = f"{release}-operator"
    deployment = kubectl.json("get", "deployment", name, "-n", ns)
    # --wait returned, so the pod passed "restricted" admission and is Ready.
    assert deployment["status"].get("readyReplicas") == 1
    assert kubectl.json("get", "serviceaccount", "polyrl-operator", "-n", ns)
    role = kubectl.json("get", "clusterrole", name)
    assert triples(role["rules"]) == EXPECTED_TRIPLES
    assert kubectl.json("get", "clusterrolebinding", name)["subjects"][0]["namespace"] == ns
    assert kubectl.json("get", "clusterkopfpeering", "polyrl")["metadata"]["name"] == "polyrl"
    for crd in ("rljobs.polyrl.dev", "policygroups.polyrl.dev", "clusterkopfpeerings.kopf.dev"):
        kubectl("get", "crd", crd)

    account = f"system:serviceaccount:{ns}:polyrl-operator"
    for verb, resource, allowed in [
        ("watch", "rljobs.polyrl.dev", "yes"),
        ("patch", "policygroups.polyrl.dev/status", "yes"),
        ("delete", "pods", "yes"),
        ("get", "secrets", "yes"),
        ("list", "secrets", "no"),
        ("create", "deployments.apps", "no"),
        ("delete", "namespaces", "no"),
    ]:
        proc = kubectl(
            "auth", "can-i", verb, resource, "--all-namespaces", "--as", account, check=False
        )
        assert proc.stdout.strip() == allowed, f"can the operator {verb} {resource}?"

    run_helm(helm_binary, "uninstall", release, "-n", ns, "--wait", env=env)
    assert kubectl("get", "deployment", name, "-n", ns, check=False).returncode != 0
    assert kubectl("get", "clusterrole", name, check=False).returncode != 0
    assert kubectl("get", "clusterkopfpeering", "polyrl", check=False).returncode != 0


def test_the_nats_pod_is_admitted_under_pod_security_restricted(
    helm_binary: Path, kubectl: Kubectl, restricted_namespace: str
) -> None:
    objects = render(
        helm_binary, {"nats": {"deploy": True, "insecure": True}}, namespace=restricted_namespace
    )
    nats = only(objects, "StatefulSet")
    template = nats["spec"]["template"]
    # What the StatefulSet controller adds: one volume per claim template.
    template["spec"]["volumes"] = [
        {
            "name": claim["metadata"]["name"],
            "persistentVolumeClaim": {"claimName": f"{claim['metadata']['name']}-nats-0"},
        }
        for claim in nats["spec"]["volumeClaimTemplates"]
    ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "nats-admission",
            "namespace": restricted_namespace,
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    }
    proc = kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr

    # The namespace does enforce "restricted": the same pod with one setting loosened fails.
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    proc = kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)
    assert proc.returncode != 0
    assert 'violates PodSecurity "restricted' in proc.stderr, proc.stderr
