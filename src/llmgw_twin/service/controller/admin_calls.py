"""The controller runtime's admin calls (`ControllerRuntime` inherits them): profiles and
deployments applied, a failed GPU cleared, a quarantine lifted, and a node's credential issued,
rotated or revoked, each durable before it is answered.

Role: behind the admin routes of `routes.py` (docs/services.md, docs/security.md); the
keys themselves are `auth.ControllerKeys`; cordon, drain, delete and explain are
`operator_api.py`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.explain import fit_warnings
from llmgw_twin.control.model import NodeId, ProfileName
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    ClearFailedGpu,
    ClearQuarantine,
    ControllerEvent,
    Step,
)
from llmgw_twin.service.common.auth import (
    ControllerKeys,
    CredentialRequestW,
    CredentialW,
    NodeCredential,
    new_token,
    token_hash,
)
from llmgw_twin.service.common.feed import RoutingFeed
from llmgw_twin.service.common.wire import DeploymentW, ProfileW, Refused
from llmgw_twin.service.controller.committer import Committer
from llmgw_twin.store.base import SqlStore

log = logging.getLogger("llmgw_twin.controller")


class AdminCalls:
    """What the runtime gives these calls is declared here (set in its `__init__`)."""

    keys: ControllerKeys | None
    store: SqlStore
    committer: Committer
    _lock: asyncio.Lock
    _agent_urls: dict[NodeId, str]

    feed: RoutingFeed

    def now_ms(self) -> int:
        raise NotImplementedError

    @property
    def core(self) -> Controller:
        raise NotImplementedError

    async def _handle(self, event: ControllerEvent, answered_in_band: NodeId | None = None) -> Step:
        raise NotImplementedError

    async def put_profile(self, name: str, body: ProfileW) -> dict[str, Any]:
        await self._handle(ApplyProfile(body.to_core(name)))
        return {"name": name, **body.model_dump(mode="json")}

    async def put_deployment(self, model: str, body: DeploymentW) -> dict[str, Any]:
        """Accepted even when it can never fit the fleet as registered (nodes may yet join), but
        answered with the reason at once, in `warnings`."""
        dep = body.to_core(model)
        await self._handle(ApplyDeployment(dep))
        self.feed.touch()  # the routers' model lists change with no routing event
        warnings = fit_warnings(self.core, [dep])
        return {"model": model, **body.model_dump(mode="json"), "warnings": warnings}

    async def clear_failed_gpu(self, node: str, gpu: int) -> dict[str, Any]:
        try:
            await self._handle(ClearFailedGpu(NodeId(node), gpu))
        except Refused as e:
            raise Refused(str(e), 404) from None
        return {"node": node, "gpu": gpu, "cleared": True}

    async def clear_quarantine(self, node: str, profile: str | None) -> dict[str, Any]:
        name = ProfileName(profile) if profile is not None else None
        try:
            await self._handle(ClearQuarantine(NodeId(node), name))
        except Refused as e:
            raise Refused(str(e), 404) from None
        return {"node": node, "profile": profile, "cleared": True}

    # --- credentials ---------------------------------------------------------------------

    def _need_keys(self) -> ControllerKeys:
        if self.keys is None:
            raise Refused("this controller asks no credentials (its config has no auth)", 409)
        return self.keys

    async def issue_credential(self, node: str, body: CredentialRequestW) -> CredentialW:
        """Onboard a node, or rotate its credential: the old token stops working at once."""
        keys = self._need_keys()
        token = new_token()
        url = body.agent_url.rstrip("/")
        async with self._lock:
            cred = NodeCredential(node, token_hash(token), url, self.now_ms())
            await self.committer.run(
                self.store.put_credential, cred.node, cred.token_sha256, url, cred.issued_ms
            )
            keys.put(cred)
            self._agent_urls[NodeId(node)] = url
        log.info("issued a credential for node %s, bound to %s", node, url)
        return CredentialW(
            node=node,
            agent_url=url,
            issued_ms=cred.issued_ms,
            token=token,
            controller_token=keys.controller_token(cred),
        )

    async def revoke_credential(self, node: str) -> dict[str, Any]:
        """The node's token stops working; nothing more is sent to it, and its silence makes
        it lost after `node_lost_after` (its replicas are replaced as for any lost node)."""
        keys = self._need_keys()
        async with self._lock:
            if keys.node(node) is None:
                raise Refused(f"node {node} has no credential", 404)
            # durable first, as an onboarding is: memory never says revoked what the store keeps
            await self.committer.run(self.store.delete_credential, node)
            keys.revoke(node)
            self._agent_urls.pop(NodeId(node), None)
        log.warning("revoked node %s's credential", node)
        return {"node": node, "revoked": True}
