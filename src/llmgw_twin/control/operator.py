"""The operator's word to the controller: profiles, deployments (a changed profile is rolled
out: `rollout.Rollout`), failed GPUs cleared, quarantines lifted, deployments deleted, nodes
cordoned and drained. Each is checked first: a refusal (`ValueError`, answered 4xx by the shell)
changes nothing."""

from __future__ import annotations

from typing import assert_never

from llmgw_twin.control import durable
from llmgw_twin.control.drain import Drainer
from llmgw_twin.control.failures import FailureBook
from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import Deployment, ModelName, Profile, ProfileName
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    ClearFailedGpu,
    ClearQuarantine,
    Cordon,
    DeleteDeployment,
    Drain,
)
from llmgw_twin.control.rollout import Rollout

OperatorEvent = (
    ApplyProfile
    | ApplyDeployment
    | ClearFailedGpu
    | ClearQuarantine
    | DeleteDeployment
    | Cordon
    | Drain
)


class Operator:
    def __init__(
        self,
        life: Lifecycle,
        profiles: dict[ProfileName, Profile],
        deployments: dict[ModelName, Deployment],
        failures: FailureBook,
        drain: Drainer,
        rollout: Rollout,
    ) -> None:
        self._life = life
        self._profiles = profiles
        self._deployments = deployments
        self._failures = failures
        self._drain = drain
        self._rollout = rollout

    def handle(self, event: OperatorEvent) -> None:
        match event:
            case ApplyProfile(profile=profile):
                self._profiles[profile.name] = profile
                self._life.out.write(durable.PutProfile(profile))
            case ApplyDeployment(deployment=dep):
                if dep.profile not in self._profiles:
                    raise ValueError(f"deployment {dep.model}: unknown profile {dep.profile}")
                for role in dep.roles:
                    if role.profile not in self._profiles:
                        raise ValueError(
                            f"deployment {dep.model}: role {role.name}: unknown profile "
                            f"{role.profile}"
                        )
                was = self._deployments.get(dep.model)
                if was is not None and _layout(was) != _layout(dep):
                    raise ValueError(
                        f"deployment {dep.model}: its roles or their profiles cannot change in "
                        "place (only the count of groups and of each role's members); delete "
                        "it and deploy it anew"
                    )
                self._deployments[dep.model] = dep
                self._life.replicas.track_model(dep.model)
                self._life.out.write(durable.PutDeployment(dep))
                if was is not None and was.profile != dep.profile:
                    self._rollout.changed(dep.model, was.profile, dep.profile)
            case ClearFailedGpu(node=node, gpu=gpu):
                capacity = self._life.capacity
                if not capacity.has_node(node) or not capacity.clear_failed_gpu(node, gpu):
                    raise ValueError(f"GPU {gpu} of node {node} is not marked failed")
                self._life.out.write(durable.DeleteFailedGpu(node, gpu))
                self._life.out.emit("gpu.cleared", node=node, gpu=gpu)
                self._life.placement_may_fit()
            case ClearQuarantine(node=node, profile=profile):
                rows = self._failures.clear(node, profile)
                if not rows:
                    what = f" for profile {profile}" if profile is not None else ""
                    raise ValueError(f"node {node} is not quarantined{what}")
                for q in rows:
                    self._life.out.write(durable.DeleteQuarantine(q.node, q.profile))
                    self._life.out.emit(
                        "node.unquarantined",
                        node=q.node,
                        profile=q.profile,
                        reason="cleared by the operator",
                    )
                self._life.placement_may_fit()
            case DeleteDeployment(model=model):
                if model not in self._deployments:
                    raise ValueError(f"no deployment of model {model}")
                del self._deployments[model]
                self._life.out.write(durable.DeleteDeployment(model))
                self._life.out.emit("deployment.deleted", model=model)
                for rec in self._life.replicas.live(model):
                    if rec.state.live:  # a copy goes with its original
                        self._life.reap(rec, "deployment deleted", scaled_down=True)
            case Cordon(node=node, cordoned=cordoned):
                if cordoned:
                    self._drain.cordon(node)
                else:
                    self._drain.uncordon(node)
            case Drain(node=node):
                self._drain.drain(node)
            case _:
                assert_never(event)


def _layout(dep: Deployment) -> tuple[tuple[str, str], ...] | None:
    """A deployment's roles and their profiles; None for a plain deployment (any profile)."""
    return tuple((r.name, r.profile) for r in dep.roles) if dep.roles else None
