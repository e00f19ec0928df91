"""The desired state's settings as the admin state shows them: profiles and timings.

Role: read-only over the controller core. `GET /v1/admin/state` carries these beside the fleet
(`views.fleet_state`) so that `llmgw-twin snapshot` can write the live fleet as a scenario file:
every profile a deployment or a live replica uses, and every control-plane timing by its scenario
key (`docs/scenarios.md`), durations in milliseconds.
"""

from __future__ import annotations

from typing import Any

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import Timings
from llmgw_twin.service.common.wire import ProfileW
from llmgw_twin.units import setting_keys

TIMING_KEYS = setting_keys(Timings)


def spec_state(core: Controller) -> dict[str, Any]:
    """`profiles` (name -> its body, as `PUT /v1/admin/profiles/NAME` takes it) and `timings`."""
    names = {d.profile for d in core.deployments()}
    names |= {r.profile.name for r in core.replicas() if r.state.live}
    profiles: dict[str, Any] = {}
    for name in sorted(names):
        profile = core.profile(name)
        if profile is not None:
            profiles[name] = ProfileW.from_core(profile).model_dump(mode="json")
    timings = {k.key: getattr(core.timings, k.attr) for k in TIMING_KEYS}
    return {"profiles": profiles, "timings": timings}
