"""Pure parts of the node agent and the certificate generator."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from polyrl.testing import pki
from polyrl.testing.nodeagent import nodes, podstatus, runner
from polyrl.testing.nodeagent.__main__ import image_envs


def test_a_node_spec_parses_labels_and_capacity() -> None:
    spec = nodes.NodeSpec.parse("gpu-0,topology.kubernetes.io/region=eu,capacity.nvidia.com/gpu=8")
    assert spec.name == "gpu-0"
    assert spec.labels == {"topology.kubernetes.io/region": "eu"}
    assert spec.capacity["nvidia.com/gpu"] == "8"
    assert spec.capacity["cpu"] == "32"


def test_a_node_option_without_a_value_is_refused() -> None:
    with pytest.raises(ValueError, match="is not key=value"):
        nodes.NodeSpec.parse("n0,oops")


def test_a_pod_succeeds_only_when_every_container_exits_zero() -> None:
    a, b = podstatus.ContainerState("a", "img"), podstatus.ContainerState("b", "img")
    a.exit_code, b.exit_code = 0, 0
    assert podstatus.final_phase([a, b]) == "Succeeded"
    b.exit_code = 1
    assert podstatus.final_phase([a, b]) == "Failed"


def test_a_running_pod_status_is_ready_and_a_finished_one_is_not() -> None:
    c = podstatus.ContainerState("main", "img", started_at=podstatus.stamp(), pid=42)
    running = podstatus.pod_status("Running", [c], start_time=podstatus.stamp())
    ready = {x["type"]: x["status"] for x in running["conditions"]}
    assert ready["Ready"] == "True"
    assert running["containerStatuses"][0]["state"]["running"]
    c.exit_code, c.finished_at = 0, podstatus.stamp()
    done = podstatus.pod_status("Succeeded", [c], start_time=podstatus.stamp())
    assert {x["type"]: x["status"] for x in done["conditions"]}["Ready"] == "False"
    assert done["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


def test_generated_certificates_chain_to_the_ca_and_carry_the_right_identities(
    tmp_path: Path,
) -> None:
    made = pki.generate(tmp_path)
    ca = x509.load_pem_x509_certificate(made.ca.cert.read_bytes())
    admin = x509.load_pem_x509_certificate(made.admin.cert.read_bytes())
    server = x509.load_pem_x509_certificate(made.apiserver.cert.read_bytes())
    admin.verify_directly_issued_by(ca)
    server.verify_directly_issued_by(ca)
    org = admin.subject.get_attributes_for_oid(x509.oid.NameOID.ORGANIZATION_NAME)
    assert org[0].value == "system:masters"
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert made.admin.key.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    "image",
    [
        "ghcr.io/polyrl/worker-vllm-cpu",
        "ghcr.io/polyrl/worker-vllm-cpu:0.1.0",
        "ghcr.io/polyrl/worker-vllm-cpu@sha256:0123abcd",
        "ghcr.io/polyrl/worker-vllm-cpu:0.1.0@sha256:0123abcd",
    ],
)
def test_a_mapped_image_runs_with_its_environment_first_on_path_whatever_its_tag(
    image: str,
) -> None:
    images = {"ghcr.io/polyrl/worker-vllm-cpu": "/envs/vllm"}
    assert runner.image_path(image, images, "/usr/bin") == "/envs/vllm/bin:/usr/bin"


@pytest.mark.parametrize(
    "image", ["ghcr.io/polyrl/worker:0.1.0", "registry:5000/polyrl/worker-vllm-cpu", ""]
)
def test_other_images_keep_the_agents_path(image: str) -> None:
    images = {"ghcr.io/polyrl/worker-vllm-cpu": "/envs/vllm"}
    assert runner.image_path(image, images, "/usr/bin") == "/usr/bin"


def test_an_image_env_option_needs_an_existing_environment(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    assert image_envs([f"img={tmp_path}"]) == {"img": str(tmp_path.resolve())}
    with pytest.raises(SystemExit, match="expected IMAGE=DIR with DIR/bin present"):
        image_envs([f"img={tmp_path / 'missing'}"])
    with pytest.raises(SystemExit, match="expected IMAGE=DIR"):
        image_envs(["img"])
