"""A node's NVLink domain as NVML shows it: the multi-node NVLink fabric its GPUs belong to.

On a GB200 NVL72 rack (or any system whose GPUs join an NVLink switch fabric across nodes) NVML
answers `nvmlDeviceGetGpuFabricInfo` for each GPU with the fabric's cluster UUID and the clique
(the NVLink partition) inside it, once the fabric manager has brought the GPU into it (state
COMPLETED, status SUCCESS). The domain is named `<cluster UUID>.<clique>`, as NVIDIA's GPU
feature discovery names the `nvidia.com/gpu.clique` node label, so a topology imported from node
labels (`llmgw-twin topology import topograph`) and what an agent reads name the same domain.

A GPU outside any such fabric (an HGX board, whose NVLink stays inside the node) answers Not
Supported, or a binding too old has no such call: the node has no domain, and nothing is said.
A GPU whose fabric is not ready yet, or GPUs of one node that disagree, leave the node without a
domain and say why in a warning: placement must not trust a domain half joined.
"""

from __future__ import annotations

import ctypes
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from llmgw_twin.control.topology import DomainId

FABRIC_STATE_COMPLETED = 3
"""`NVML_GPU_FABRIC_STATE_COMPLETED`: the GPU has joined its NVLink fabric."""
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3

_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}


def read_domain(
    nvml: Any, handles: Sequence[tuple[int, Any]], warn: Callable[[str], None]
) -> DomainId | None:
    """The NVLink domain every GPU of `handles` (index, NVML handle) is in, or None."""
    query = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None)
    struct = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
    if query is None or struct is None or not handles:
        return None  # a binding without the call: no multi-node NVLink known to it
    found: dict[int, DomainId | None] = {}
    for index, handle in handles:
        info = struct()
        try:
            query(handle, ctypes.byref(info))
        except Exception as e:  # NVMLError (NotSupported on a GPU in no such fabric), or other
            if getattr(e, "value", None) != getattr(
                nvml, "NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED
            ):
                warn(f"NVML GPU {index}: NVLink fabric unknown ({type(e).__name__}: {e})")
            found[index] = None
            continue
        found[index] = _domain(index, info, nvml, warn)
    domains = set(found.values())
    if domains == {None}:
        return None
    if len(domains) > 1:
        shown = ", ".join(f"GPU {i}: {d or 'none'}" for i, d in sorted(found.items()))
        warn(f"the GPUs are not all in one NVLink domain ({shown}): the node is taken as in none")
        return None
    return next(iter(domains))


def _domain(index: int, info: Any, nvml: Any, warn: Callable[[str], None]) -> DomainId | None:
    state = int(getattr(info, "state", 0))
    status = int(getattr(info, "status", NVML_SUCCESS))
    if state == 0:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        return None
    completed = getattr(nvml, "NVML_GPU_FABRIC_STATE_COMPLETED", FABRIC_STATE_COMPLETED)
    if state != completed or status != getattr(nvml, "NVML_SUCCESS", NVML_SUCCESS):
        said = _STATES.get(state, str(state))
        warn(
            f"NVML GPU {index}: its NVLink fabric is not ready (state {said}, status {status}): "
            "no NVLink domain taken"
        )
        return None
    cluster = _cluster_bytes(info)
    if not any(cluster):
        return None
    return DomainId(f"{uuid.UUID(bytes=cluster)}.{int(info.cliqueId)}")


def _cluster_bytes(info: Any) -> bytes:
    """The 16 bytes of `clusterUuid` as they are: a binding that decodes a char array as text
    stops at the first zero byte, which a UUID may hold."""
    field = getattr(type(info), "clusterUuid", None)
    if field is not None and isinstance(info, ctypes.Structure):
        return ctypes.string_at(ctypes.addressof(info) + field.offset, 16)
    raw = getattr(info, "clusterUuid", b"")
    data = bytes(raw) if not isinstance(raw, str) else raw.encode("latin-1")
    return data[:16].ljust(16, b"\0")
