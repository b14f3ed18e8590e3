"""The node agent does a kubelet's duties for our pods, on the session's real control plane.

Each test runs pods in a namespace labelled for exec mode (their commands run as local
processes) and checks what a pod sees or what the API server reports: the service-account
token and in-cluster config, volumes, its own address and hostname, probes, termination
messages, `kubectl logs`, and PersistentVolumeClaims from the test provisioner.
"""

from __future__ import annotations

import base64
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl, condition
from polyrl.testing.nodeagent.runner import deleted_pod_logs
from polyrl.testing.waiting import wait_until

PY = sys.executable


def pod(name: str, command: list[str], **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "none", "command": command}
    container.update(extra.pop("container", {}))
    spec = {"restartPolicy": "Never", "containers": [container], **extra}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def python(code: str) -> list[str]:
    return [PY, "-u", "-c", code]


def get(kubectl: Kubectl, ns: str, name: str, kind: str = "pod") -> dict[str, Any]:
    found: dict[str, Any] = kubectl.json("get", kind, name, "-n", ns)
    return found


def finished(kubectl: Kubectl, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        p = get(kubectl, ns, name)
        return p if p["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_until(f"pod {name} to finish", done, timeout=timeout)


def running(kubectl: Kubectl, ns: str, name: str, *, ready: bool = False) -> dict[str, Any]:
    def up() -> dict[str, Any] | None:
        p = get(kubectl, ns, name)
        ok = p["status"].get("phase") == "Running"
        return p if ok and (not ready or condition(p, "Ready") == "True") else None

    return wait_until(f"pod {name} Running{' and Ready' if ready else ''}", up)


def logs(kubectl: Kubectl, ns: str, name: str, *args: str) -> str:
    return kubectl("logs", "-n", ns, name, *args).stdout


def terminated(p: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = p["status"]["containerStatuses"][0]["state"]["terminated"]
    return state


def jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims


# --- the service account and the API ---------------------------------------------------


def test_a_pod_reads_the_api_through_in_cluster_config_with_its_bound_token(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    ns = exec_namespace
    kubectl("create", "serviceaccount", "reader", "-n", ns)
    kubectl(
        "create",
        "rolebinding",
        "reader",
        "--clusterrole=view",
        f"--serviceaccount={ns}:reader",
        "-n",
        ns,
    )
    code = (
        "import os\n"
        "from kubernetes import client, config\n"
        "config.load_incluster_config()\n"
        f"pods = client.CoreV1Api().list_namespaced_pod({ns!r}).items\n"
        "print('pods:', ' '.join(p.metadata.name for p in pods))\n"
        "d = '/var/run/secrets/kubernetes.io/serviceaccount'\n"
        "print('namespace:', open(d + '/namespace').read())\n"
        "print('token:', open(d + '/token').read())\n"
        "print('ca:', open(d + '/ca.crt').read().startswith('-----BEGIN CERTIFICATE'))\n"
        "print('host:', os.environ['KUBERNETES_SERVICE_HOST'])\n"
    )
    kubectl.apply(
        json.dumps(pod("api-reader", python(code), serviceAccountName="reader")), "-n", ns
    )
    done = finished(kubectl, ns, "api-reader")
    out = logs(kubectl, ns, "api-reader")
    assert done["status"]["phase"] == "Succeeded", out
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert "api-reader" in lines["pods"].split()
    assert lines["namespace"] == ns
    assert lines["ca"] == "True"
    assert lines["host"] == "127.0.0.1"
    claims = jwt_claims(lines["token"])
    assert claims["sub"] == f"system:serviceaccount:{ns}:reader"
    assert claims["kubernetes.io"]["pod"]["name"] == "api-reader"  # bound to the pod
    assert claims["kubernetes.io"]["pod"]["uid"] == done["metadata"]["uid"]


def test_the_token_is_requested_again_before_it_gets_old(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    # The session's agent re-requests tokens older than 4 s (--token-max-age); a kubelet
    # does so at 80 % of their lifetime.
    code = (
        "import time\n"
        "seen = []\n"
        "while len(seen) < 3:\n"
        "    t = open('/var/run/secrets/kubernetes.io/serviceaccount/token').read()\n"
        "    if t not in seen:\n"
        "        seen.append(t); print(t, flush=True)\n"
        "    time.sleep(0.5)\n"
    )
    kubectl.apply(json.dumps(pod("rotating", python(code))), "-n", exec_namespace)
    done = finished(kubectl, exec_namespace, "rotating", timeout=90)
    tokens = logs(kubectl, exec_namespace, "rotating").split()
    assert done["status"]["phase"] == "Succeeded"
    assert len(set(tokens)) == 3
    issued = [jwt_claims(t)["iat"] for t in tokens]
    assert issued == sorted(issued)
    assert issued[0] < issued[-1]
    review = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": tokens[0]},
    }
    result = json.loads(kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review)).stdout)
    # An older token stays valid until it expires (the pod still exists... or not: it is
    # bound to the pod, which has finished but not been deleted).
    assert result["status"]["authenticated"] is True


# --- volumes -----------------------------------------------------------------------------


def test_configmap_secret_downward_and_empty_dir_volumes_are_mounted_and_synced(
    kubectl: Kubectl, exec_namespace: str, tmp_path: Path
) -> None:
    ns = exec_namespace
    kubectl("create", "configmap", "settings", "-n", ns, "--from-literal=mode=fast")
    kubectl("create", "secret", "generic", "creds", "-n", ns, "--from-literal=password=s3cret")
    code = (
        "import os, time\n"
        "print('mode:', open('/etc/settings/mode').read())\n"
        "print('password:', open('/creds/pw').read())\n"
        "print('labels:', open('/info/labels').read().replace(chr(10), ','))\n"
        "open('/scratch/x', 'w').write('1')\n"
        "print('scratch:', os.listdir('/scratch'))\n"
        "print('shm:', os.listdir('/dev/shm'))\n"
        "while open('/etc/settings/mode').read() != 'slow': time.sleep(0.2)\n"
        "print('mode now: slow', flush=True)\n"
    )
    spec = pod(
        "volumes",
        python(code),
        volumes=[
            {"name": "settings", "configMap": {"name": "settings"}},
            {
                "name": "creds",
                "secret": {"secretName": "creds", "items": [{"key": "password", "path": "pw"}]},
            },
            {
                "name": "info",
                "downwardAPI": {
                    "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
                },
            },
            {"name": "scratch", "emptyDir": {}},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
        ],
        container={
            "volumeMounts": [
                {"name": "settings", "mountPath": "/etc/settings"},
                {"name": "creds", "mountPath": "/creds", "readOnly": True},
                {"name": "info", "mountPath": "/info"},
                {"name": "scratch", "mountPath": "/scratch"},
                {"name": "shm", "mountPath": "/dev/shm"},
            ]
        },
    )
    spec["metadata"]["labels"] = {"app": "vol"}
    kubectl.apply(json.dumps(spec), "-n", ns)
    running(kubectl, ns, "volumes")
    wait_until("the pod to read its volumes", lambda: "shm:" in logs(kubectl, ns, "volumes"))
    kubectl("patch", "configmap", "settings", "-n", ns, "-p", '{"data": {"mode": "slow"}}')
    done = finished(kubectl, ns, "volumes", timeout=60)
    out = logs(kubectl, ns, "volumes")
    assert done["status"]["phase"] == "Succeeded", out
    assert "mode: fast" in out
    assert "password: s3cret" in out
    assert 'labels: app="vol"' in out
    assert "scratch: ['x']" in out
    assert "shm: []" in out  # its own memory-backed directory, not the host's /dev/shm
    assert "mode now: slow" in out  # the ConfigMap's update reached the running pod


def test_a_pod_waits_for_a_configmap_that_does_not_exist_yet(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    ns = exec_namespace
    spec = pod(
        "waiter",
        ["cat", "/cfg/key"],
        volumes=[{"name": "cfg", "configMap": {"name": "later"}}],
        container={"volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]},
    )
    kubectl.apply(json.dumps(spec), "-n", ns)

    def waiting() -> str | None:
        statuses = get(kubectl, ns, "waiter")["status"].get("containerStatuses") or []
        state = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return state.get("message") if state.get("reason") == "ContainerCreating" else None

    message = wait_until("the pod to wait for its ConfigMap", waiting)
    assert "configmap" in message
    assert "later" in message
    kubectl("create", "configmap", "later", "-n", ns, "--from-literal=key=here")
    done = finished(kubectl, ns, "waiter")
    assert done["status"]["phase"] == "Succeeded"
    assert logs(kubectl, ns, "waiter") == "here"


def test_an_unsupported_volume_type_fails_the_pod_with_a_message(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    spec = pod(
        "nfs",
        ["true"],
        volumes=[{"name": "share", "nfs": {"server": "nfs.example", "path": "/x"}}],
        container={"volumeMounts": [{"name": "share", "mountPath": "/share"}]},
    )
    kubectl.apply(json.dumps(spec), "-n", exec_namespace)
    done = finished(kubectl, exec_namespace, "nfs")
    assert done["status"]["phase"] == "Failed"
    assert "'nfs' is not supported by the node agent" in done["status"]["message"]


def test_a_claim_is_provisioned_and_outlives_the_pod_that_wrote_it(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    ns = exec_namespace
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kubectl.apply(json.dumps(claim), "-n", ns)
    volume = {
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "container": {"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
    }
    kubectl.apply(
        json.dumps(pod("writer", ["sh", "-c", "echo kept > /data/file"], **volume)), "-n", ns
    )
    assert finished(kubectl, ns, "writer")["status"]["phase"] == "Succeeded"
    kubectl("delete", "pod", "writer", "-n", ns)
    kubectl.apply(json.dumps(pod("reader", ["cat", "/data/file"], **volume)), "-n", ns)
    assert finished(kubectl, ns, "reader")["status"]["phase"] == "Succeeded"
    assert logs(kubectl, ns, "reader") == "kept\n"

    bound = get(kubectl, ns, "data", "pvc")
    assert bound["status"]["phase"] == "Bound"
    assert bound["spec"]["storageClassName"] == "polyrl-host-path"  # the default class
    pv = kubectl.json("get", "pv", bound["spec"]["volumeName"])
    directory = Path(pv["spec"]["hostPath"]["path"])
    assert (directory / "file").read_text() == "kept\n"
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"

    kubectl("delete", "pod", "reader", "-n", ns)
    kubectl("delete", "pvc", "data", "-n", ns)
    wait_until(
        "the released volume and its directory removed",
        lambda: (
            not directory.exists()
            and kubectl("get", "pv", pv["metadata"]["name"], check=False).returncode != 0
        ),
    )


def test_a_retained_volume_keeps_its_files_after_the_claim_is_deleted(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    ns = exec_namespace
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "keep"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kubectl.apply(json.dumps(claim), "-n", ns)
    name = wait_until(
        "the claim bound", lambda: get(kubectl, ns, "keep", "pvc")["spec"].get("volumeName")
    )
    kubectl("patch", "pv", name, "-p", '{"spec": {"persistentVolumeReclaimPolicy": "Retain"}}')
    directory = Path(kubectl.json("get", "pv", name)["spec"]["hostPath"]["path"])
    (directory / "model.safetensors").write_text("weights")
    kubectl("delete", "pvc", "keep", "-n", ns)
    wait_until(
        "the volume Released",
        lambda: kubectl.json("get", "pv", name)["status"]["phase"] == "Released",
    )
    # The provisioner sees the release and must leave it alone. It handles volumes one at a
    # time, in order: once it has removed a volume released after this one, it has seen it.
    later = {**claim, "metadata": {"name": "later"}}
    kubectl.apply(json.dumps(later), "-n", ns)
    gone = wait_until(
        "the later claim bound", lambda: get(kubectl, ns, "later", "pvc")["spec"].get("volumeName")
    )
    kubectl("delete", "pvc", "later", "-n", ns)
    wait_until(
        "the later claim's volume (reclaim policy Delete) removed",
        lambda: kubectl("get", "pv", gone, check=False).returncode != 0,
    )
    assert kubectl.json("get", "pv", name)["status"]["phase"] == "Released"
    assert (directory / "model.safetensors").read_text() == "weights"
    kubectl("delete", "pv", name)


def test_the_python_environment_stays_visible_under_a_volume_that_covers_it(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    # An emptyDir over the virtualenv's parent (the repository, or a clone under /tmp in
    # CI) would hide the interpreter; the agent binds its Python environment back on top.
    covered = str(Path(sys.prefix).parent)
    code = "import polyrl.api, os; print(sorted(os.listdir(os.path.dirname(os.__file__)))[:1])"
    spec = pod(
        "covered",
        python(code),
        volumes=[{"name": "cover", "emptyDir": {}}],
        container={"volumeMounts": [{"name": "cover", "mountPath": covered}]},
    )
    kubectl.apply(json.dumps(spec), "-n", exec_namespace)
    done = finished(kubectl, exec_namespace, "covered")
    assert done["status"]["phase"] == "Succeeded", logs(kubectl, exec_namespace, "covered")


def test_a_read_only_root_file_system_is_read_only_but_its_volumes_are_writable(
    kubectl: Kubectl, exec_namespace: str, tmp_path: Path
) -> None:
    target = tmp_path / "should-not-exist"
    code = (
        "import errno\n"
        f"try:\n    open({str(target)!r}, 'w')\nexcept OSError as e:\n    print('root:', errno.errorcode[e.errno])\n"
        "open('/tmp/ok', 'w').write('1'); print('tmp: ok')\n"
        "print('dev:', len(open('/dev/urandom', 'rb').read(8)), open('/dev/null', 'w').write('x'))\n"
    )
    spec = pod(
        "readonly",
        python(code),
        volumes=[{"name": "tmp", "emptyDir": {}}],
        container={
            "securityContext": {"readOnlyRootFilesystem": True},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        },
    )
    kubectl.apply(json.dumps(spec), "-n", exec_namespace)
    assert finished(kubectl, exec_namespace, "readonly")["status"]["phase"] == "Succeeded"
    out = logs(kubectl, exec_namespace, "readonly")
    # The emptyDir covers the host's /tmp, and the rest of the root is read-only.
    assert "root: ENOENT" in out or "root: EROFS" in out
    assert "tmp: ok" in out
    assert "dev: 8 1" in out  # device nodes stay usable (torch reads /dev/urandom)
    assert not target.exists()


# --- network -----------------------------------------------------------------------------


def test_two_pods_listen_on_the_same_port_each_at_its_own_address_behind_a_service(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    ns = exec_namespace
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 8080}]},
    }
    kubectl.apply(json.dumps(service), "-n", ns)
    server = "import http.server as h, socket; h.HTTPServer(('0.0.0.0', 8080), type('H', (h.BaseHTTPRequestHandler,), {'do_GET': lambda s: (s.send_response(200), s.end_headers(), s.wfile.write(socket.gethostname().encode()))})).serve_forever()"
    for name in ("web-a", "web-b"):
        spec = pod(
            name,
            python(server),
            container={
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
            },
        )
        spec["metadata"]["labels"] = {"app": "web"}
        kubectl.apply(json.dumps(spec), "-n", ns)
    ips = {
        name: running(kubectl, ns, name, ready=True)["status"]["podIP"]
        for name in ("web-a", "web-b")
    }
    assert len(set(ips.values())) == 2
    assert all(not ip.startswith("127.") for ip in ips.values()), ips

    import urllib.request

    for name, ip in ips.items():
        with urllib.request.urlopen(f"http://{ip}:8080/", timeout=5) as resp:
            assert resp.read().decode() == name  # each pod's hostname is its name

    def endpoints() -> set[str] | None:
        slices = kubectl.json(
            "get", "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=web"
        )
        found = {
            a for s in slices["items"] for e in s.get("endpoints") or [] for a in e["addresses"]
        }
        return found if found == set(ips.values()) else None

    wait_until("the endpoint slice to list both pods", endpoints)


def test_a_pod_sees_its_hostname_and_a_hosts_file_that_names_it(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    code = "import socket; print(socket.gethostname()); print(socket.gethostbyname(socket.gethostname()))"
    kubectl.apply(json.dumps(pod("named", python(code))), "-n", exec_namespace)
    done = finished(kubectl, exec_namespace, "named")
    hostname, address = logs(kubectl, exec_namespace, "named").split()
    assert hostname == "named"
    assert address == done["status"]["podIP"]


def test_pods_of_one_subdomain_resolve_each_other_as_a_headless_service_would_let_them(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    # Each waits until the other's name resolves: the first started must see the second's,
    # which came after it, so its hosts file is rewritten in place.
    code = (
        "import socket, sys, time\n"
        "for _ in range(300):\n"
        "    try: print(socket.gethostbyname(sys.argv[1])); break\n"
        "    except OSError: time.sleep(0.1)\n"
    )
    for name, other in (("first", "second"), ("second", "first")):
        spec = pod(name, [*python(code), f"{other}.gang"], hostname=name, subdomain="gang")
        kubectl.apply(json.dumps(spec), "-n", exec_namespace)
        if name == "first":
            running(kubectl, exec_namespace, "first")
    first, second = (finished(kubectl, exec_namespace, n) for n in ("first", "second"))
    assert logs(kubectl, exec_namespace, "first").strip() == second["status"]["podIP"]
    assert logs(kubectl, exec_namespace, "second").strip() == first["status"]["podIP"]


# --- probes, restarts, termination messages, logs -----------------------------------------


def test_a_readiness_probe_keeps_a_pod_unready_until_it_passes(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    ns = exec_namespace
    spec = pod(
        "slow-start",
        ["sh", "-c", "sleep 3; touch /state/ready; sleep 600"],
        volumes=[{"name": "state", "emptyDir": {}}],
        container={
            "volumeMounts": [{"name": "state", "mountPath": "/state"}],
            "readinessProbe": {
                "exec": {"command": ["test", "-f", "/state/ready"]},
                "periodSeconds": 1,
            },
        },
    )
    kubectl.apply(json.dumps(spec), "-n", ns)
    first = running(kubectl, ns, "slow-start")
    assert condition(first, "Ready") == "False"
    running(kubectl, ns, "slow-start", ready=True)
    kubectl("delete", "pod", "slow-start", "-n", ns, "--grace-period=1")


def test_a_failing_liveness_probe_restarts_the_container_and_keeps_the_old_log(
    kubectl: Kubectl, exec_namespace: str, tmp_path: Path
) -> None:
    ns = exec_namespace
    # The first run leaves /state/seen, which fails the probe; the second run also leaves
    # /state/healed, which passes it.
    run = "echo run; [ -f /state/seen ] && touch /state/healed; touch /state/seen; sleep 600"
    # Each probe notes its verdict where the test reads it (a host directory).
    probe = (
        "if [ ! -f /state/seen ] || [ -f /state/healed ]; then echo pass >> /probes/log;"
        " else echo fail >> /probes/log; exit 1; fi"
    )
    spec = pod(
        "flaky",
        ["sh", "-c", run],
        restartPolicy="Always",
        terminationGracePeriodSeconds=1,
        volumes=[
            {"name": "state", "emptyDir": {}},
            {"name": "probes", "hostPath": {"path": str(tmp_path), "type": "Directory"}},
        ],
        container={
            "volumeMounts": [
                {"name": "state", "mountPath": "/state"},
                {"name": "probes", "mountPath": "/probes"},
            ],
            "livenessProbe": {
                "exec": {"command": ["sh", "-c", probe]},
                "periodSeconds": 1,
                "failureThreshold": 2,
            },
        },
    )
    kubectl.apply(json.dumps(spec), "-n", ns)

    def restarted() -> dict[str, Any] | None:
        statuses = get(kubectl, ns, "flaky")["status"].get("containerStatuses") or []
        ok = statuses and statuses[0]["restartCount"] >= 1 and "running" in statuses[0]["state"]
        return statuses[0] if ok else None

    status = wait_until("the container restarted by its liveness probe", restarted, timeout=60)
    assert status["restartCount"] == 1
    assert "liveness probe" in status["lastState"]["terminated"]["message"]
    assert status["lastState"]["terminated"]["exitCode"] == 143  # 128 + SIGTERM
    assert logs(kubectl, ns, "flaky", "--previous") == "run\n"

    def verdicts_since_the_last_failure() -> list[str]:
        said = (tmp_path / "log").read_text().split()
        return said[len(said) - said[::-1].index("fail") :] if "fail" in said else said

    # Healed: the agent probes the new container more often than it takes failures to kill
    # it (failureThreshold 2), and every probe passes; no second restart.
    wait_until(
        "three passing probes of the restarted container",
        lambda: len(verdicts_since_the_last_failure()) >= 3,
    )
    assert set(verdicts_since_the_last_failure()) == {"pass"}
    assert get(kubectl, ns, "flaky")["status"]["containerStatuses"][0]["restartCount"] == 1
    kubectl("delete", "pod", "flaky", "-n", ns, "--grace-period=1")


def test_termination_messages_come_from_the_file_or_the_log_on_error(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    ns = exec_namespace
    custom = pod(
        "reporter",
        ["sh", "-c", "echo 'all done: 3 steps' > /out/msg"],
        container={"terminationMessagePath": "/out/msg"},
    )
    fallback = pod(
        "crasher",
        python(
            "import sys; print('loading...'); sys.exit(\"model path '/nope' is not a directory\")"
        ),
        container={"terminationMessagePolicy": "FallbackToLogsOnError"},
    )
    for spec in (custom, fallback):
        kubectl.apply(json.dumps(spec), "-n", ns)
    assert terminated(finished(kubectl, ns, "reporter"))["message"] == "all done: 3 steps\n"
    crashed = terminated(finished(kubectl, ns, "crasher"))
    assert crashed["exitCode"] == 1
    assert crashed["message"].endswith("model path '/nope' is not a directory\n")
    assert "loading..." in crashed["message"]


def test_kubectl_logs_follows_tails_and_limits_a_running_pod(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    ns = exec_namespace
    code = "import time\nfor i in range(8):\n    print(f'line {i}', flush=True); time.sleep(0.4)\n"
    kubectl.apply(json.dumps(pod("talker", python(code))), "-n", ns)
    running(kubectl, ns, "talker")
    followed = logs(kubectl, ns, "talker", "-f")  # returns when the container exits
    assert followed.splitlines() == [f"line {i}" for i in range(8)]
    assert logs(kubectl, ns, "talker", "--tail=2").splitlines() == ["line 6", "line 7"]
    assert logs(kubectl, ns, "talker", "--limit-bytes=6") == "line 0"
    missing = kubectl("logs", "-n", ns, "talker", "--previous", check=False)
    assert missing.returncode != 0


def test_a_deleted_pods_log_is_kept_to_its_last_line(
    kubectl: Kubectl, exec_namespace: str, cluster: Cluster
) -> None:
    ns = exec_namespace
    kubectl.apply(json.dumps(pod("brief", python("print('last words', flush=True)"))), "-n", ns)
    uid = finished(kubectl, ns, "brief")["metadata"]["uid"]
    kubectl("delete", "pod", "brief", "-n", ns)
    agent = cluster.workdir / "agent"
    sandbox = agent / "pods" / f"{ns}_brief_{uid}"
    wait_until(f"the sandbox {sandbox} removed", lambda: not sandbox.exists())
    kept = deleted_pod_logs(agent) / f"{ns}_brief_{uid}" / "main.log"
    assert kept.read_text() == "last words\n"


# --- modes -------------------------------------------------------------------------------


def test_pods_in_an_unlabelled_namespace_are_marked_running_but_never_run(
    kubectl: Kubectl, namespace: str, exec_namespace: str, tmp_path: Path
) -> None:
    marker = tmp_path / f"ran-{uuid.uuid4().hex[:6]}"
    kubectl.apply(json.dumps(pod("idle", ["touch", str(marker)])), "-n", namespace)
    p = running(kubectl, namespace, "idle")
    assert p["status"]["podIP"]
    # The same command in an exec namespace, after it: once the agent has run that one to
    # its end, it would have run the first by then, had it run it at all.
    witness = tmp_path / "witness"
    kubectl.apply(json.dumps(pod("witness", ["touch", str(witness)])), "-n", exec_namespace)
    assert finished(kubectl, exec_namespace, "witness")["status"]["phase"] == "Succeeded"
    assert witness.exists()
    assert not marker.exists()
    assert get(kubectl, namespace, "idle")["status"]["phase"] == "Running"
