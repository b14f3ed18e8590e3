"""Workers reach NATS over TLS when their credentials directory holds a CA, and say clearly
why when the server's certificate is not the CA's.

Each test starts its own nats-server serving TLS only, with certificates made in the test
(`polyrl.testing.pki`, the same generator as the test control plane's): a CA, a server
certificate for 127.0.0.1, a client certificate. The worker side is the real one:
`Runtime.connect`, reading `POLYRL_NATS_TLS_DIR` as a pod reads its mounted Secret.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from polyrl.api import natstls
from polyrl.api.launch import Role, WorkerConfig
from polyrl.api.resources import RLJobSpec
from polyrl.local.natsserver import NatsServer, ServerTls
from polyrl.testing import pki
from polyrl.workers.errors import Unavailable
from polyrl.workers.runtime.worker import Runtime

pytestmark = pytest.mark.slow


def secret_dir(root: Path, made: pki.Pki, *, client: bool) -> Path:
    """What the job's Secret mounts in a pod: ca.crt, and the client pair if there is one."""
    root.mkdir(parents=True)
    shutil.copy(made.ca.cert, root / natstls.CA)
    if client:
        shutil.copy(made.admin.cert, root / natstls.CERT)
        shutil.copy(made.admin.key, root / natstls.KEY)
    return root


def config(url: str) -> WorkerConfig:
    spec = RLJobSpec.model_validate(
        {"policies": [{"name": "solver", "model": {"path": "tiny-llama://tls"}}]}
    )
    return WorkerConfig(namespace="t", job="tls", role=Role.WORKFLOW, nats_url=url, spec=spec)


@pytest.fixture
def made(tmp_path: Path) -> pki.Pki:
    return pki.generate(tmp_path / "pki")


async def test_a_worker_connects_over_tls_verifying_the_server_and_uses_jetstream(
    made: pki.Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = ServerTls(made.apiserver.cert, made.apiserver.key, made.ca.cert, verify_clients=True)
    with NatsServer(tmp_path / "nats", tls=tls) as server:
        assert server.url.startswith("tls://")
        monkeypatch.setenv(natstls.TLS_DIR_ENV, str(secret_dir(tmp_path / "s", made, client=True)))
        rt = await Runtime.connect(config(server.url), "workflow-0")
        try:
            assert rt.nc.is_connected
            await rt.beat()  # JetStream works over it: the heartbeat bucket takes a put
            assert (await rt.kv.keys()) == ["_.workflow.workflow-0"]
        finally:
            await rt.close()


async def test_a_server_that_wants_a_client_certificate_refuses_a_worker_without_one(
    made: pki.Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = ServerTls(made.apiserver.cert, made.apiserver.key, made.ca.cert, verify_clients=True)
    with NatsServer(tmp_path / "nats", tls=tls) as server:
        monkeypatch.setenv(natstls.TLS_DIR_ENV, str(secret_dir(tmp_path / "s", made, client=False)))
        with pytest.raises(Unavailable, match=f"cannot reach NATS at {server.url}") as refused:
            await Runtime.connect(config(server.url), "workflow-0", timeout=2)
    assert "the server wants a client certificate: tls.crt and tls.key" in str(refused.value)


async def test_a_server_certificate_from_another_ca_is_refused_naming_the_ca_file(
    made: pki.Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = pki.generate(tmp_path / "other-pki")
    tls = ServerTls(other.apiserver.cert, other.apiserver.key, other.ca.cert)
    with NatsServer(tmp_path / "nats", tls=tls) as server:
        monkeypatch.setenv(natstls.TLS_DIR_ENV, str(secret_dir(tmp_path / "s", made, client=False)))
        with pytest.raises(Unavailable) as refused:
            await Runtime.connect(config(server.url), "workflow-0", timeout=2)
    # e.g. "TLS: the server's certificate was not accepted (certificate signature failure;
    # is ca.crt the CA that signed it?)": OpenSSL's reason, and which file to look at
    assert re.search(
        r"TLS: the server's certificate was not accepted \(.+; is ca\.crt the CA that signed it\?\)",
        str(refused.value),
    ), str(refused.value)
