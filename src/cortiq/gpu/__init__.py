"""GPU offload through WebGPU (the `wgpu` package: Vulkan, Metal, DX12).

`LLM(path, device="gpu")` builds the host model (config, options, load-time
transforms) and hands it to `to_device`, which uploads the weights once in their CMF
dtypes and returns a model object with the session interface (new_state, forward,
rollback, can_rollback). Numerics and limits: docs/gpu.md.
"""
from __future__ import annotations

from ..errors import ConfigError
from .device import Device, adapters, resolve_device

__all__ = ["Device", "adapters", "resolve_device", "to_device"]


def to_device(host_model, device: Device | None = None):
    """The GPU twin of a host model (ConfigError for an architecture or option the
    GPU path does not run)."""
    arch = getattr(host_model, "arch", None)
    if arch == "dory":
        from .dory import GpuDoryModel
        return GpuDoryModel(host_model, device)
    if arch == "deepseek_v4":
        from .deepseek_v4 import GpuDeepSeekV4Model
        return GpuDeepSeekV4Model(host_model, device)
    raise ConfigError(f"device='gpu': the {arch} architecture runs on the CPU only in this "
                      "cortiq (GPU: dory, deepseek_v4)")
