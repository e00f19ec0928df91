"""Who may call what: tokens, their hashes, node credentials, and the checks on each request.

Role: the production shells' authentication (docs/security.md). Five kinds of caller:
- the **admin** (operators, `llmgw-twin ctl`): a bearer token whose SHA-256 the controller's
  config lists under `auth.admin_tokens`;
- an **API client** of the router: a key listed (hashed) under `auth.api_keys`; with none
  listed, the inference routes are open (`ApiKeys` is the router service's own check);
- a **router** process following the controller's routing feed: a token listed (hashed) under
  `auth.router_tokens`;
- a **node**: the token issued for it at onboarding (`POST /v1/admin/nodes/{node}/credential`),
  kept by the controller only as its hash, bound to the node's name and its agent's address;
- a **reader** (a metrics scraper, a dashboard): a token listed (hashed) under
  `auth.reader_tokens`, let through where an admin is asked for on reads only (`GET` or `HEAD`
  of `/metrics` and `/v1/admin/...`: the state, the events, explain, a drain's progress), and
  refused (403) on everything that changes the fleet;
- the **controller**, calling an agent: a token derived for that node's credential
  (HMAC-SHA256 of the credential's hash under the controller's secret key), so no token is
  stored in the clear anywhere on the controller and each agent holds only its own.

Invariants:
- Tokens are random (256 bits), compared only as hashes, in constant time; a token is never
  logged and never stored by the controller. A refusal is logged with the caller's address,
  the path and why, never with what was presented.
- No or a malformed `Authorization: Bearer` header, or a token that matches nothing: 401 with
  `WWW-Authenticate: Bearer`. A valid token of the wrong kind, or a node's token used for
  another node: 403.
- A node credential replaced by a new one (rotation) or revoked stops working at once.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException

from llmgw_twin.service.common.wire import Url

log = logging.getLogger("llmgw_twin.auth")

TOKEN_PREFIX = "lgw_"  # noqa: S105  (a prefix, not a secret)
HASH_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_TOKEN_LENGTH = 256

Kind = Literal["admin", "api", "node", "controller", "router", "reader"]
READS = frozenset({"GET", "HEAD"})
"""The methods a reader may use, where an admin may."""


def reader_may(request: Request) -> bool:
    """Whether a reader may make this request in an admin's place: a read of the metrics or of
    an admin route (no admin read hands out a secret: credentials are issued by POST)."""
    path = request.url.path
    return request.method in READS and (path == "/metrics" or path.startswith("/v1/admin/"))


def new_token() -> str:
    """A fresh bearer token: 256 random bits, with a prefix that makes a leaked one findable."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What is stored and compared: `sha256:<hex>` of the token."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_hash(text: str) -> str:
    """`text` if it is a token hash as `token_hash` writes it; ValueError otherwise."""
    if not HASH_PATTERN.match(text):
        raise ValueError(
            "expected a token hash sha256:<64 lowercase hex digits> "
            "(`llmgw-twin ctl new-token` prints one), not a token"
        )
    return text


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("ascii"), b.encode("ascii"))


def any_matches(candidate: str, hashes: Iterable[str]) -> bool:
    """Whether `candidate` equals one of `hashes`; every one is compared, so the time taken
    does not say which matched or how far a comparison got."""
    found = False
    for h in hashes:
        found |= same(candidate, h)
    return found


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class NodeCredential:
    """A node's credential as the controller keeps it: never the token itself."""

    node: str
    token_sha256: str
    agent_url: str
    issued_ms: int


@dataclass(frozen=True, slots=True)
class Caller:
    kind: Kind
    node: str | None = None


def bearer(request: Request) -> str | None:
    """The bearer token of a request, or None when it carries none (or not as `Bearer`)."""
    return bearer_of(request.headers.get("authorization"))


def bearer_of(header: str | None) -> str | None:
    """The bearer token in an `Authorization` header's value, as `bearer` reads it."""
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    return token


class Refusal(HTTPException):
    """An auth refusal; `code` is the machine-readable reason OpenAI clients read
    (`missing_api_key`, `invalid_api_key`), None where the message is enough."""

    def __init__(
        self, status: int, detail: str, headers: dict[str, str] | None, code: str | None
    ) -> None:
        super().__init__(status, detail, headers=headers)
        self.code = code


def refuse(request: Request, status: int, detail: str, code: str | None = None) -> HTTPException:
    """The refusal to raise; logged with who asked and why, never with the token."""
    client = request.client.host if request.client is not None else "?"
    log.warning("refused %s %s from %s: %s", request.method, request.url.path, client, detail)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return Refusal(status, detail, headers, code)


MISSING = "missing credentials: send Authorization: Bearer <token>"
INVALID = "invalid credentials"
MISSING_API_KEY = (
    "no API key: send one as `Authorization: Bearer <key>` (the OpenAI client's api_key, or "
    "$OPENAI_API_KEY); an operator makes keys with `llmgw-twin ctl new-token`"
)
INVALID_API_KEY = (
    "the API key matches none this service accepts: check it for a typo or an old key; "
    "an operator lists the accepted keys' hashes under auth.api_keys"
)


def presented(request: Request, missing: str = MISSING, code: str | None = None) -> str:
    """The request's bearer token; a request without one is refused (401)."""
    token = bearer(request)
    if token is None:
        raise refuse(request, 401, missing, code)
    return token


def presented_api_key(request: Request) -> str:
    """An API client's key, refused (401 `missing_api_key`) when the request has none."""
    return presented(request, MISSING_API_KEY, "missing_api_key")


class ControllerKeys:
    """The controller's view of every credential: admin and API-key hashes from its config,
    node credentials from its store, and the secret its agent tokens derive from."""

    def __init__(
        self,
        *,
        admin_hashes: Iterable[str],
        api_key_hashes: Iterable[str],
        secret: bytes,
        nodes: Iterable[NodeCredential] = (),
        router_hashes: Iterable[str] = (),
        reader_hashes: Iterable[str] = (),
    ) -> None:
        self.admin_hashes = tuple(admin_hashes)
        self.reader_hashes = tuple(reader_hashes)
        self.api_key_hashes = tuple(api_key_hashes)
        self.router_hashes = tuple(router_hashes)
        self._secret = secret
        self._nodes: dict[str, NodeCredential] = {}
        self._by_hash: dict[str, NodeCredential] = {}
        for cred in nodes:
            self.put(cred)

    # --- node credentials --------------------------------------------------------------------

    def put(self, cred: NodeCredential) -> None:
        """Bind (or re-bind: the old token stops working) a node's credential."""
        old = self._nodes.pop(cred.node, None)
        if old is not None:
            self._by_hash.pop(old.token_sha256, None)
        self._nodes[cred.node] = cred
        self._by_hash[cred.token_sha256] = cred

    def revoke(self, node: str) -> NodeCredential | None:
        old = self._nodes.pop(node, None)
        if old is not None:
            self._by_hash.pop(old.token_sha256, None)
        return old

    def node(self, node: str) -> NodeCredential | None:
        return self._nodes.get(node)

    def nodes(self) -> tuple[NodeCredential, ...]:
        return tuple(self._nodes[n] for n in sorted(self._nodes))

    def controller_token(self, cred: NodeCredential) -> str:
        """The token the controller presents to this node's agent, bound to this credential."""
        mac = hmac.new(self._secret, f"{cred.node}\0{cred.token_sha256}".encode(), "sha256")
        return TOKEN_PREFIX + mac.hexdigest()

    # --- checks ------------------------------------------------------------------------------

    def identify(self, token: str) -> Caller | None:
        """Who `token` is, or None when it matches no credential."""
        h = token_hash(token)
        if any_matches(h, self.admin_hashes):
            return Caller("admin")
        cred = self._by_hash.get(h)
        if cred is not None and same(h, cred.token_sha256):
            return Caller("node", cred.node)
        if any_matches(h, self.router_hashes):
            return Caller("router")
        if any_matches(h, self.api_key_hashes):
            return Caller("api")
        if any_matches(h, self.reader_hashes):
            return Caller("reader")
        return None

    def require(self, request: Request, kind: Kind, *others: Kind) -> Caller:
        """The caller, if its credential is of `kind` (or one of `others`)."""
        if kind == "api":  # an OpenAI client: told in its words (`missing_api_key`, ...)
            caller = self.identify(presented_api_key(request))
            if caller is None:
                raise refuse(request, 401, INVALID_API_KEY, "invalid_api_key")
        else:
            caller = self.identify(presented(request))
            if caller is None:
                raise refuse(request, 401, INVALID)
        if caller.kind == "reader" and "admin" in (kind, *others) and reader_may(request):
            return caller
        if caller.kind != kind and caller.kind not in others:
            detail = f"a {caller.kind} credential may not call this endpoint"
            if caller.kind == "reader":
                detail += ": a reader token reads the metrics and the admin state only"
            if kind == "api":
                detail += ": send an API key (one listed under auth.api_keys)"
            raise refuse(request, 403, detail, "wrong_credential_kind" if kind == "api" else None)
        return caller


class ApiKeys:
    """The router service's clients: an API key whose hash its config lists; with none listed,
    anyone who reaches it."""

    def __init__(self, hashes: Iterable[str]) -> None:
        self.hashes = tuple(hashes)

    def require(self, request: Request) -> None:
        if self.hashes and not any_matches(token_hash(presented_api_key(request)), self.hashes):
            raise refuse(request, 401, INVALID_API_KEY, "invalid_api_key")


class AgentKeys:
    """An agent's credential: its node token (for its calls to the controller) and the hash of
    the token the controller presents to it."""

    def __init__(self, node: str, token: str, controller_token: str) -> None:
        self.node = node
        self.token = token
        self._controller_sha256 = token_hash(controller_token)

    def require_controller(self, request: Request) -> None:
        if not same(token_hash(presented(request)), self._controller_sha256):
            raise refuse(request, 401, INVALID)


def load_secret(path: Path) -> bytes:
    """The controller's secret key from `path`, made there (mode 0600) on first use."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = secrets.token_hex(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text + "\n")
        log.info("made the controller's secret key %s", path)
    if not re.fullmatch(r"[0-9a-f]{64,}", text):
        raise ValueError(f"{path}: not a secret key (64 or more hex digits)")
    return bytes.fromhex(text)


@dataclass(frozen=True, slots=True)
class CredentialFile:
    """What an agent holds: written once at onboarding, readable by its owner only."""

    node: str
    token: str
    controller_token: str

    def write(self, path: Path) -> None:
        body = json.dumps(
            {"node": self.node, "token": self.token, "controller_token": self.controller_token},
            sort_keys=True,
        )
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body + "\n")
        os.replace(tmp, path)

    @staticmethod
    def read(path: Path) -> CredentialFile:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: cannot read the node credential: {e}") from None
        fields = ("node", "token", "controller_token")
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in fields):
            raise ValueError(f"{path}: a node credential has string fields {', '.join(fields)}")
        return CredentialFile(data["node"], data["token"], data["controller_token"])


class CredentialRequestW(BaseModel):
    """`POST /v1/admin/nodes/{node}/credential`: the address the node's agent is reached at;
    the controller calls that address only, whatever a registration says."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    agent_url: Url


class CredentialW(BaseModel):
    """The answer to an onboarding: the only time the tokens are shown."""

    node: str
    agent_url: str
    issued_ms: int
    token: str
    """The node's token, for its calls to the controller."""
    controller_token: str
    """What the controller presents to this node's agent."""
