"""NATS decentralised authentication: nkeys, JWTs and creds files, made and signed here.

nats-server trusts an operator key; the operator's JWT names the accounts' keys it signed;
each account's JWT lists signing keys; a user's JWT, signed by one of them, carries the
user's permissions, and the server enforces them. polyrl uses one account for its jobs
(`Trust`): the polyrl operator holds only that account's *signing* key (a Secret it alone
reads) and signs one user per job, role and policy, with the subjects `polyrl.api.access`
grants. `polyrl run` makes a fresh trust for each run and runs its workers the same way.

Why not the `nats-jwt` package: the claims are a handful of JSON fields, and signing is one
ed25519 signature (from `nkeys`, which nats-py already uses to read creds files); nats-jwt
would add dataclasses-json, marshmallow, pycryptodome and pytz to the operator's image for
that. The format follows nats-server's JWT v2 (`jwt/v2` in Go): header `{"typ": "JWT",
"alg": "ed25519-nkey"}`, claims with `jti`, `iat`, `iss`, `sub`, `name`, optional `exp`,
and a `nats` object typed operator, account or user.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

from polyrl.api.access import ADMIN, Grant

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
# A CONNECT line carries the user's JWT, and a workflow runner's JWT lists the subjects of
# every policy of its job: past nats-server's default 4 KiB for three policies or more.
MAX_CONTROL_LINE = 64 * 1024
PREFIXES = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}
UNLIMITED = -1
TRUST_FILE = "trust.json"  # every seed of a trust, as `polyrl nats-trust` writes it
TRUST_KEYS = ("operator", "system", "account", "signing")


@dataclass(frozen=True, slots=True)
class Key:
    """An nkey: its seed (secret) and public key."""

    seed: str

    @classmethod
    def new(cls, kind: str) -> Key:
        return cls(nkeys.encode_seed(os.urandom(32), PREFIXES[kind]).decode())

    @property
    def pair(self) -> nkeys.KeyPair:
        return nkeys.from_seed(self.seed.encode())

    @property
    def public(self) -> str:
        return str(self.pair.public_key.decode())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def encode(claims: dict[str, Any], signer: Key) -> str:
    """A signed JWT of `claims` (given `jti` from their hash, `iat` and `iss` here)."""
    body = {"iat": int(time.time()), "iss": signer.public, **claims}
    body["jti"] = base64.b32encode(hashlib.sha256(json.dumps(body).encode()).digest()).decode()
    signing = f"{_b64(json.dumps(HEADER).encode())}.{_b64(json.dumps(body).encode())}"
    return f"{signing}.{_b64(signer.pair.sign(signing.encode()))}"


def decode(token: str) -> dict[str, Any]:
    """The claims of a JWT, unverified (for tests and for reading a Secret back)."""
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims


def operator_jwt(key: Key, system_account: str) -> str:
    nats = {"type": "operator", "version": 2, "system_account": system_account}
    return encode({"sub": key.public, "name": "polyrl", "nats": nats}, key)


def account_jwt(
    operator: Key, account: Key, name: str, *, signing: Key | None, jetstream: bool
) -> str:
    limits: dict[str, Any] = {
        "subs": UNLIMITED, "data": UNLIMITED, "payload": UNLIMITED, "imports": UNLIMITED,
        "exports": UNLIMITED, "wildcards": True, "conn": UNLIMITED, "leaf": UNLIMITED,
    }  # fmt: skip
    if jetstream:
        limits |= {
            "mem_storage": UNLIMITED, "disk_storage": UNLIMITED, "streams": UNLIMITED,
            "consumer": UNLIMITED, "max_ack_pending": UNLIMITED,
            "mem_max_stream_bytes": UNLIMITED, "disk_max_stream_bytes": UNLIMITED,
        }  # fmt: skip
    nats: dict[str, Any] = {"type": "account", "version": 2, "limits": limits}
    if signing is not None:
        nats["signing_keys"] = [signing.public]
    return encode({"sub": account.public, "name": name, "nats": nats}, operator)


def user_jwt(
    signing: Key, account: str, user: Key, name: str, grant: Grant, *, expires: float | None = None
) -> str:
    """A user of `account` allowed exactly `grant`, signed by the account's signing key."""
    nats = {
        "type": "user", "version": 2, "issuer_account": account,
        "pub": {"allow": grant.publish}, "sub": {"allow": grant.subscribe},
        "subs": UNLIMITED, "data": UNLIMITED, "payload": UNLIMITED,
    }  # fmt: skip
    claims: dict[str, Any] = {"sub": user.public, "name": name, "nats": nats}
    if expires is not None:
        claims["exp"] = int(expires)
    return encode(claims, signing)


def creds(token: str, user: Key) -> str:
    """A creds file (what nats-py's `user_credentials` and the nats CLI read)."""
    return (
        f"-----BEGIN NATS USER JWT-----\n{token}\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed}\n------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


@dataclass(frozen=True, slots=True)
class Signer:
    """What signs a job's users: the account's public key and one of its signing keys."""

    account: str
    signing: Key

    def user_creds(self, name: str, grant: Grant, *, expires: float | None = None) -> str:
        user = Key.new("user")
        return creds(user_jwt(self.signing, self.account, user, name, grant, expires=expires), user)


@dataclass(frozen=True, slots=True)
class Trust:
    """A whole trust chain: operator, system account, the jobs' account and its signing key.

    `server_config` is what nats-server needs to trust it (a memory resolver with both
    accounts preloaded); `signer` is all the polyrl operator needs to sign users.
    """

    operator: Key
    system: Key
    account: Key
    signing: Key

    @classmethod
    def new(cls) -> Trust:
        return cls(Key.new("operator"), Key.new("account"), Key.new("account"), Key.new("account"))

    @classmethod
    def load(cls, directory: Path) -> Trust:
        """The trust `polyrl nats-trust DIR` wrote (its `trust.json`, every seed)."""
        path = directory / TRUST_FILE
        try:
            seeds = json.loads(path.read_text())
            return cls(*(Key(str(seeds[k])) for k in TRUST_KEYS))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"{path}: not a trust written by `polyrl nats-trust` ({type(err).__name__}: {err})"
            ) from None

    @property
    def signer(self) -> Signer:
        return Signer(self.account.public, self.signing)

    def server_config(self) -> str:
        system = account_jwt(self.operator, self.system, "SYS", signing=None, jetstream=False)
        jobs = account_jwt(
            self.operator, self.account, "polyrl", signing=self.signing, jetstream=True
        )
        return (
            f"operator: {operator_jwt(self.operator, self.system.public)}\n"
            f"system_account: {self.system.public}\n"
            "resolver: MEMORY\n"
            f"resolver_preload: {{\n  {self.system.public}: {system}\n"
            f"  {self.account.public}: {jobs}\n}}\n"
        )


def signing_manifest(trust: Trust, *, secret: str, namespace: str) -> dict[str, Any]:
    """The operator's namespace and its signing Secret, as one `kubectl apply -f` list."""
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": namespace},
                "stringData": {"account": trust.account.public, "seed": trust.signing.seed},
            },
        ],
    }


def write_trust(
    trust: Trust, out: Path, *, secret: str, namespace: str = "polyrl-system"
) -> dict[Path, str]:
    """What `polyrl nats-trust` writes: each file and what it is for."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = signing_manifest(trust, secret=secret, namespace=namespace)
    seeds = {k: getattr(trust, k).seed for k in TRUST_KEYS}
    files = {
        out / "auth.conf": (
            trust.server_config() + f"max_control_line: {MAX_CONTROL_LINE}\n",
            "nats-server: include it in the server's configuration "
            f"(python -m polyrl.local.natsserver --trust {out} does)",
        ),
        out / "signing-secret.yaml": (
            json.dumps(manifest, indent=2) + "\n",
            f"kubectl apply -f it (namespace {namespace} and the Secret {secret}); "
            f"chart value nats.signingSecret={secret}",
        ),
        out / "admin.creds": (
            trust.signer.user_creds("admin", ADMIN),
            "an admin user of the jobs account (nats CLI: --creds)",
        ),
        out / TRUST_FILE: (json.dumps(seeds, indent=2) + "\n", "every seed: keep it offline"),
    }
    for path, (text, _) in files.items():
        path.write_text(text)
        path.chmod(0o600)
    return {path: what for path, (_, what) in files.items()}
