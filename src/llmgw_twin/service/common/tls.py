"""TLS for the services: what a server presents and asks for, what a client trusts and shows.

A server (`ServerTls`) is served by uvicorn with its certificate and key; with `client_ca` set it
asks every client for a certificate signed by that CA and refuses the handshake without one
(mutual TLS: the controller and its agents each prove who they are before any byte of HTTP).
A client (`ClientTls`) trusts the CA it names (the system's store when none) and, for mutual
TLS, presents its own certificate. Paths are as the config file gave them, made absolute.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert: Path
    key: Path
    client_ca: Path | None = None
    """Set: every client must present a certificate this CA signed (mutual TLS)."""

    def uvicorn_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}
        if self.client_ca is not None:
            options |= {"ssl_ca_certs": str(self.client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return options


@dataclass(frozen=True, slots=True)
class ClientTls:
    ca: Path | None = None
    """The CA that signed the server's certificate; None: the system's trust store."""
    cert: Path | None = None
    key: Path | None = None
    """This client's certificate and key, presented to a server that asks (mutual TLS)."""

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca) if self.ca is not None else None)
        if self.cert is not None:
            ctx.load_cert_chain(str(self.cert), str(self.key) if self.key is not None else None)
        return ctx


def client_verify(tls: ClientTls | None) -> ssl.SSLContext | bool:
    """httpx's `verify` for a client: its own context when configured, else the defaults."""
    return tls.context() if tls is not None else True
