"""`polyrl nats-trust` writes a trust a real nats-server accepts, and a signing Secret whose
key signs users that server admits with their grants."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from polyrl.api import access, natsjwt
from polyrl.api.launch import Role
from polyrl.api.naming import JobNames
from polyrl.local import natsserver, processes
from polyrl.operator import natsusers
from polyrl.testing.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.slow


def serve(conf_dir: Path) -> tuple[processes.Managed, str]:
    """nats-server with JetStream, its configuration including the written auth.conf."""
    port = processes.free_port()
    config = conf_dir / "server.conf"
    config.write_text(
        f"listen: 127.0.0.1:{port}\njetstream {{ store_dir: {str(conf_dir / 'js')!r} }}\n"
        "include ./auth.conf\n"
    )
    proc = processes.start(
        "nats-server", [natsserver.binary(), "-c", config], log=conf_dir / "server.log"
    )
    return proc, f"nats://127.0.0.1:{port}"


async def connect(url: str, creds: Path, inbox: str = "_INBOX") -> Client:
    """Connected as the user of `creds`, once the server (just started) accepts them."""
    refused: list[Exception] = []

    async def attempt() -> Client | None:
        try:
            return await nats.connect(
                url, user_credentials=str(creds), inbox_prefix=inbox, max_reconnect_attempts=0
            )
        except Exception as err:
            refused.append(err)
            return None

    try:
        return await wait_until_async(f"a connection to {url}", attempt, timeout=20, interval=0.1)
    except AssertionError as timed_out:
        raise timed_out from (refused[-1] if refused else None)


def test_the_written_trust_serves_jobs_and_its_secret_signs_users_it_admits(
    tmp_path: Path,
) -> None:
    out = tmp_path / "trust"
    made = subprocess.run(
        [sys.executable, "-m", "polyrl.cli", "nats-trust", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert {p.name for p in out.iterdir()} == {
        "auth.conf", "signing-secret.yaml", "admin.creds", "trust.json",
    }  # fmt: skip
    assert all(p.stat().st_mode & 0o077 == 0 for p in out.iterdir())  # owner only
    written = json.loads((out / "signing-secret.yaml").read_text())
    namespace, secret = written["items"]
    assert (namespace["kind"], namespace["metadata"]["name"]) == ("Namespace", "polyrl-system")
    assert secret["metadata"] == {"name": "polyrl-nats-signing", "namespace": "polyrl-system"}
    data = {k: base64.b64encode(v.encode()).decode() for k, v in secret["stringData"].items()}
    signer = natsusers.signer_from(data, "the written Secret")
    again = subprocess.run(
        [sys.executable, "-m", "polyrl.cli", "nats-trust", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"keeping the trust in {out}" in again.stdout
    assert json.loads((out / "signing-secret.yaml").read_text()) == written  # the same keys
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    elsewhere = subprocess.run(
        [sys.executable, "-m", "polyrl.cli", "nats-trust", str(tmp_path / "other")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert elsewhere.returncode == 2
    assert "is not empty and holds no trust.json" in elsewhere.stderr

    proc, url = serve(out)
    try:
        asyncio.run(publish_as_a_workflow_user(url, out / "admin.creds", signer, tmp_path))
    finally:
        processes.stop(proc)
    assert f"max_control_line: {natsjwt.MAX_CONTROL_LINE}" in (out / "auth.conf").read_text()


async def publish_as_a_workflow_user(
    url: str, admin_creds: Path, signer: natsjwt.Signer, tmp_path: Path
) -> None:
    admin = await connect(url, admin_creds)
    names = JobNames(namespace="team", job="math")
    stream = names.requests_stream("solver")
    await admin.jetstream().add_stream(name=stream, subjects=[names.requests_subject("solver")])
    creds = tmp_path / "workflow.creds"
    grant = access.grant(names, Role.WORKFLOW, None, ["solver"])
    creds.write_text(signer.user_creds("math-workflow", grant))
    workflow = await connect(url, creds, access.inbox_prefix(names, Role.WORKFLOW, None))
    ack = await workflow.jetstream().publish(names.requests_subject("solver"), b"{}")
    assert ack.stream == stream
    await workflow.close()
    await admin.close()


def test_the_nats_helper_with_a_trust_admits_its_users_and_refuses_anonymous_clients(
    tmp_path: Path,
) -> None:
    out = tmp_path / "trust"
    subprocess.run(
        [sys.executable, "-m", "polyrl.cli", "nats-trust", str(out)],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    helper = processes.start(
        "nats-helper",
        [sys.executable, "-m", "polyrl.local.natsserver", "--trust", str(out)],
        log=tmp_path / "helper.log",
    )
    try:
        url = wait_for_url(tmp_path / "helper.log")
        assert "only users of the trust" in (tmp_path / "helper.log").read_text()
        asyncio.run(anonymous_is_refused_and_admin_admitted(url, out / "admin.creds"))
    finally:
        processes.stop(helper)


def wait_for_url(log: Path) -> str:
    def url() -> str | None:
        words = log.read_text().split() if log.exists() else []
        return next((w.rstrip(",") for w in words if w.startswith("nats://")), None)

    return wait_until(f"the helper to print its URL in {log}", url, timeout=30, interval=0.1)


async def anonymous_is_refused_and_admin_admitted(url: str, admin_creds: Path) -> None:
    host, port = url.removeprefix("nats://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    await reader.readline()  # INFO
    writer.write(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
    answer = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    await writer.wait_closed()
    assert b"Authorization Violation" in answer, answer
    admin = await connect(url, admin_creds)
    assert admin.is_connected
    await admin.close()
