"""TLS to NATS: the client's context from a directory of PEM files, for operator and workers.

The directory is the job's NATS credentials Secret, mounted in every worker pod at
`TLS_MOUNT` (the operator reads the same Secret through the API). A `ca.crt` in it turns TLS
on: the server's certificate must chain to that CA and name the host the URL names; with
`tls.crt` and `tls.key` beside it the client also presents a certificate (for a server that
verifies clients). Without `ca.crt`, a `tls://` URL still gets TLS, verified against the
system's CAs (nats-py's default). docs/operator.md has the Secret's keys.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

TLS_DIR_ENV = "POLYRL_NATS_TLS_DIR"
TLS_MOUNT = "/etc/polyrl/nats"
CA, CERT, KEY = "ca.crt", "tls.crt", "tls.key"


def context(directory: Path) -> ssl.SSLContext | None:
    """A verifying client context from `directory`'s PEM files; None if it holds no CA."""
    ca = directory / CA
    if not ca.is_file():
        return None
    tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    cert, key = directory / CERT, directory / KEY
    if cert.is_file() and key.is_file():
        tls.load_cert_chain(str(cert), str(key))
    return tls


def lacks_client_cert(directory: Path) -> bool:
    """TLS is on (a CA) but the client has no certificate to present."""
    return (directory / CA).is_file() and not (
        (directory / CERT).is_file() and (directory / KEY).is_file()
    )


def explain(err: BaseException, *, no_client_cert: bool = False) -> str:
    """What a failed connection says: a TLS failure with its reason, anything else by type.

    Under TLS 1.3 a server that wants a client certificate says so only after the client's
    handshake is done; the client may see that alert, or only the closed socket when it
    writes next (a broken pipe or a reset). Without a certificate of our own, that closed
    socket gets the same hint as the alert.
    """
    if isinstance(err, ssl.SSLCertVerificationError):
        return f"TLS: the server's certificate was not accepted ({err.verify_message}; is {CA} the CA that signed it?)"
    if isinstance(err, ssl.SSLError):
        reason = str(err.reason or err)
        if "CERTIFICATE_REQUIRED" in reason:
            return f"TLS: {reason} (the server wants a client certificate: {CERT} and {KEY})"
        return f"TLS: {reason}"
    if no_client_cert and isinstance(err, (BrokenPipeError, ConnectionResetError)):
        return (
            f"{type(err).__name__}: the server closed the TLS connection (if it verifies "
            f"clients, the server wants a client certificate: {CERT} and {KEY})"
        )
    return type(err).__name__


class LastError:
    """`record` is an `error_cb` for nats.connect: it keeps the last error, logged once a kind.

    A first connection that keeps failing (a TLS refusal, say) is retried until the caller's
    timeout, which then says only "TimeoutError"; `why` gives the error behind it.
    """

    def __init__(self, log: logging.Logger, *, no_client_cert: bool = False) -> None:
        self.log = log
        self.no_client_cert = no_client_cert
        self.error: BaseException | None = None

    async def record(self, error: BaseException) -> None:
        if self.error is None or type(error) is not type(self.error):
            self.log.warning("NATS: %s", explain(error, no_client_cert=self.no_client_cert))
        if not (isinstance(self.error, ssl.SSLError) and not isinstance(error, ssl.SSLError)):
            self.error = error  # a TLS refusal says more than the closed socket after it

    def why(self, error: BaseException) -> str:
        behind = self.error if isinstance(error, TimeoutError) and self.error else error
        return explain(behind, no_client_cert=self.no_client_cert)
