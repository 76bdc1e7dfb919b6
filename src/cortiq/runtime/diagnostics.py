"""cortiq.show_config(): the configuration report of every layer that has one.

The kernel layer reports the build, ISA, threads, precision and preload
(``_config.config_lines``); the GPU layer reports its adapters
(``gpu.device.adapter_lines``). The report is put together here, above both, so the
kernel layer never imports the GPU layer.
"""
from __future__ import annotations

from ..kernels._config import config_lines


def show_config(file=None) -> None:
    """Print the active ISA, CPU features, threads and their pool, precision, preload,
    compiler, version and the GPU adapters."""
    # imported here: `import cortiq` does not load the GPU package
    from ..gpu.device import adapter_lines
    print("\n".join(config_lines() + adapter_lines()), file=file)
