"""`llmgw-twin ctl ...`: an operator's word to the controller, and the tokens it takes.

Each command but `new-token` is one bounded HTTP call to the controller's admin API
(`--controller`, default `http://127.0.0.1:8080`): it prints the controller's answer and exits
0 when the controller accepted, 1 when it refused (the GPU is not failed, the node not
quarantined, the token not an admin's), 2 when the controller could not be reached. The admin
token is read from the file `--token-file` names, or from the environment variable
`LLMGW_TWIN_TOKEN`; never from the command line, where any user of the host could read it.

- `new-token`: print a fresh token and, on the next line, the hash a config lists;
- `onboard NODE --agent-url URL --out FILE`: issue (or rotate) a node's credential and write it,
  readable by its owner only, to FILE for the node's agent (`credential:` in its config);
- `revoke NODE`: the node's credential stops working at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from llmgw_twin.service.common.auth import CredentialFile, new_token, token_hash
from llmgw_twin.service.common.tls import ClientTls

DEFAULT_CONTROLLER = "http://127.0.0.1:8080"
TIMEOUT_S = 10.0


TOKEN_ENV = "LLMGW_TWIN_TOKEN"  # noqa: S105  (a variable name)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--controller",
        default=DEFAULT_CONTROLLER,
        help=f"the controller's base URL, or every controller's, comma-separated: the leader "
        f"answers, standbys point at it (default {DEFAULT_CONTROLLER})",
    )
    parser.add_argument(
        "--token-file", type=Path, help=f"a file holding the admin token (else ${TOKEN_ENV})"
    )
    parser.add_argument("--ca", type=Path, help="the CA that signed the controller's certificate")
    parser.add_argument("--cert", type=Path, help="this client's certificate (mutual TLS)")
    parser.add_argument("--key", type=Path, help="the key of --cert (when not in the same file)")


OUTPUTS = ("table", "json", "yaml")


def add_output(parser: argparse.ArgumentParser) -> None:
    """`-o table|json|yaml`, as every ctl read takes it (`--json` is kept as `-o json`)."""
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="table: for people (the default); json or yaml: the controller's answer as is",
    )
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json", help=argparse.SUPPRESS
    )


def print_answer(args: argparse.Namespace, answer: dict[str, Any], table: str) -> None:
    """The answer in the form `-o` asked for; `table` is its rendering for people."""
    if args.output == "json":
        print(json.dumps(answer, sort_keys=True))
    elif args.output == "yaml":
        print(yaml.safe_dump(answer, sort_keys=True), end="")
    else:
        print(table)


class CtlError(Exception):
    pass


def _token(args: argparse.Namespace) -> tuple[str | None, str]:
    """The admin token, and where it came from in words (for a refusal's hint)."""
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise CtlError(f"cannot read the token file: {e}") from None
        return token or None, f"the token in --token-file {args.token_file}"
    return os.environ.get(TOKEN_ENV) or None, f"the token in ${TOKEN_ENV}"


def _headers(args: argparse.Namespace) -> dict[str, str]:
    token, _ = _token(args)
    return {"authorization": f"Bearer {token}"} if token else {}


def refusal_hint(args: argparse.Namespace, status: int) -> str:
    """What to do about a 401 or 403, naming where ctl read the token ("" for other refusals)."""
    if status not in (401, 403):
        return ""
    try:
        token, source = _token(args)
    except CtlError:
        return ""
    if status == 401 and token is None:
        return (
            f"no admin token was sent: set ${TOKEN_ENV}, or pass --token-file FILE "
            "(a file holding the token; `llmgw-twin ctl new-token` makes one)"
        )
    if status == 401:
        return (
            f"{source} is not an admin token of this controller: its hash must be listed under "
            "auth.admin_tokens in the controller's config"
        )
    return (
        f"{source} is a credential of another kind (a reader's, which reads only, a node's, "
        f"a router's or an API key): ctl needs an admin token, in ${TOKEN_ENV} or --token-file"
    )


def _request(
    args: argparse.Namespace,
    method: str,
    path: str,
    *,
    params: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
    quiet: bool = False,
) -> tuple[int, dict[str, Any]]:
    """(0 accepted, 1 refused, 2 unreachable) and the answer's body; refusals are printed, or,
    `quiet`, left to the caller: the answer then holds the HTTP status as `_status`."""
    bases = [u.strip().rstrip("/") for u in str(args.controller).split(",") if u.strip()]
    try:
        verify = ClientTls(args.ca, args.cert, args.key or args.cert).context()
        headers = _headers(args)
        with httpx.Client(timeout=TIMEOUT_S, trust_env=False, verify=verify) as client:
            reply = _to_leader(client, bases, method, path, params, body, headers)
    except (CtlError, OSError) as e:  # ssl.SSLError is an OSError
        print(f"error: {e}", file=sys.stderr)
        return 2, {}
    except httpx.HTTPError as e:
        print(f"error: cannot reach the controller at {e.request.url}: {e}", file=sys.stderr)
        return 2, {}
    try:
        answer = reply.json()
    except ValueError:
        answer = {"detail": reply.text}
    if not isinstance(answer, dict):
        answer = {"detail": answer}
    if reply.is_success:
        return 0, answer
    if quiet:
        return 1, answer | {"_status": reply.status_code}
    refused(args, reply.status_code, answer)
    return 1, answer


def refused(args: argparse.Namespace, status: int, answer: dict[str, Any]) -> None:
    """Print a refusal, and what to do about it when ctl knows."""
    print(f"refused ({status}): {answer.get('detail', answer)}", file=sys.stderr)
    if hint := refusal_hint(args, status):
        print(f"hint: {hint}", file=sys.stderr)


def _to_leader(
    client: httpx.Client,
    bases: list[str],
    method: str,
    path: str,
    params: dict[str, str] | None,
    body: dict[str, Any] | None,
    headers: dict[str, str],
) -> httpx.Response:
    """The call at each address in turn until a controller that leads answers: one that cannot
    be reached is passed over, a standby's answer (503 naming the leader) sends the call to the
    leader it names next. The last answer when none leads; the last failure when none answers."""
    queue, tried = list(bases), set()
    reply: httpx.Response | None = None
    failure: httpx.HTTPError | None = None
    while queue:
        base = queue.pop(0)
        if base in tried:
            continue
        tried.add(base)
        try:
            reply = client.request(method, base + path, params=params, json=body, headers=headers)
        except httpx.HTTPError as e:
            failure = e
            continue
        leader = _standby_points_at(reply)
        if leader is None:
            return reply
        if leader and leader not in tried:
            queue.insert(0, leader)
    if reply is not None:
        return reply
    assert failure is not None
    raise failure


def _standby_points_at(reply: httpx.Response) -> str | None:
    """The leader's address when `reply` is a standby's (`controller/standby.py`), else None;
    "" for a standby that knows of no leader's address."""
    if reply.status_code != 503:
        return None
    try:
        leader = reply.json().get("leader", False)
    except (ValueError, AttributeError):
        return None
    if leader is False:
        return None
    url = leader.get("url") if isinstance(leader, dict) else None
    return url.rstrip("/") if isinstance(url, str) else ""


def _call(
    args: argparse.Namespace,
    method: str,
    path: str,
    say: Callable[[dict[str, Any]], str],
    params: dict[str, str] | None = None,
) -> int:
    """One write: the controller's answer in a sentence (`say` writes it), or as it came with
    `-o json|yaml`, as every ctl write prints it."""
    status, answer = _request(args, method, path, params=params)
    if status == 0:
        print_answer(args, answer, say(answer) if args.output not in ("json", "yaml") else "")
    return status


def add_write_output(parser: argparse.ArgumentParser) -> None:
    """`-o text|json|yaml` for a write: a sentence for people (the default), or the answer."""
    parser.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "yaml"),
        default="text",
        help="text: a sentence for people (the default); json or yaml: the controller's answer",
    )


def _changed(answer: dict[str, Any]) -> str:
    return "" if answer.get("changed", True) else " (it already was: nothing changed)"


def issue_credential(
    args: argparse.Namespace, node: str, agent_url: str
) -> tuple[int, CredentialFile | None]:
    """Issue (or rotate) `node`'s credential, bound to `agent_url`: (0, the credential), or the
    status of `_request` and None (the refusal already printed). `args` as `_common` reads."""
    path = f"/v1/admin/nodes/{node}/credential"
    status, answer = _request(args, "POST", path, body={"agent_url": agent_url})
    if status != 0:
        return status, None
    return 0, CredentialFile(answer["node"], answer["token"], answer["controller_token"])


class ClearGpu:
    """Clear a GPU the controller holds failed (after it was repaired or replaced)."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("node")
        parser.add_argument("gpu", type=int)
        add_write_output(parser)
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        path = f"/v1/admin/nodes/{args.node}/failed-gpus/{args.gpu}"
        return _call(
            args,
            "DELETE",
            path,
            lambda a: f"node {a['node']}: GPU {a['gpu']} cleared, placement may use it again",
        )


class ClearQuarantine:
    """Lift a node's quarantine, for one profile (`--profile`) or for all of them."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("node")
        parser.add_argument("--profile", help="only this profile's quarantine")
        add_write_output(parser)
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        params = {"profile": args.profile} if args.profile else None

        def say(a: dict[str, Any]) -> str:
            which = f"profile {a['profile']}" if a.get("profile") else "every profile"
            return f"node {a['node']}: quarantine lifted for {which}"

        return _call(args, "DELETE", f"/v1/admin/nodes/{args.node}/quarantine", say, params)


class NewToken:
    """Print a fresh token, then the hash that goes into a config (`auth.admin_tokens`,
    `auth.api_keys`); the token itself is shown this once."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        pass

    @staticmethod
    def main(_args: argparse.Namespace) -> int:
        token = new_token()
        print(token)
        print(token_hash(token))
        return 0


class Onboard:
    """Issue a node's credential (or rotate it: the old one stops working at once) and write
    it to the file its agent reads."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("node")
        parser.add_argument(
            "--agent-url",
            required=True,
            help="where the node's agent listens, as the "
            "controller reaches it; the controller calls this address only",
        )
        parser.add_argument("--out", required=True, type=Path, help="the credential file")
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        status, cred = issue_credential(args, args.node, args.agent_url)
        if cred is None:
            return status
        cred.write(args.out)
        print(f"node {cred.node}: credential written to {args.out}, bound to {args.agent_url}")
        return 0


class Revoke:
    """Revoke a node's credential: its agent is refused from now on and sent nothing more."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("node")
        add_write_output(parser)
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        return _call(
            args,
            "DELETE",
            f"/v1/admin/nodes/{args.node}/credential",
            lambda a: f"node {a['node']}: credential revoked, its agent is refused from now on",
        )
