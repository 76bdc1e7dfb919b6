"""GPU offload through WebGPU (the `wgpu` package: Vulkan, Metal, DX12).

`LLM(path, device="gpu")` builds the host model (config, options, load-time
transforms) and hands it to `to_device`, which uploads the weights once in their CMF
dtypes and returns a model with the protocol of `cortiq.models.base` (its own forward,
the host's capabilities). Numerics and limits: docs/gpu.md.
"""
from __future__ import annotations

from ..errors import ConfigError
from .device import Device, adapters, resolve_device

__all__ = ["Device", "adapters", "resolve_device", "to_device"]


def to_device(host_model, device: Device | None = None):
    """The GPU twin of a host model, the class the architecture registry names
    (`cortiq.models.SPECS`: `gpu_model`); ConfigError for an architecture or option the
    GPU path does not run."""
    from ..models import gpu_names, lookup, resolve
    arch = host_model.arch
    spec = lookup(arch)
    if spec is None or spec.gpu_model is None:
        raise ConfigError(f"device='gpu': the {arch} architecture runs on the CPU only in "
                          f"this cortiq (GPU: {', '.join(gpu_names())})")
    return resolve(spec.gpu_model, f"device='gpu': the {arch} GPU model")(host_model, device)
