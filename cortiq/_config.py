"""Process-wide settings: which kernel table runs and how many threads it uses.

Read once at import from CORTIQ_ISA and CORTIQ_NUM_THREADS; changed later through
cortiq.set_num_threads(). A forced ISA that cannot run here is an error, never a
silent fallback.
"""
import os

from . import _kernels
from .errors import ConfigError

__version__ = "0.1.0"


def _default_threads() -> int:
    raw = os.environ.get("CORTIQ_NUM_THREADS", "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"CORTIQ_NUM_THREADS must be a positive integer, got {raw!r}")
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _init() -> None:
    forced = os.environ.get("CORTIQ_ISA", "").strip().lower()
    if forced:
        try:
            _kernels.set_isa(forced)
        except ValueError:
            raise ConfigError(
                f"CORTIQ_ISA={forced!r} cannot run here; valid choices: "
                f"{', '.join(_kernels.usable_isas())}") from None
    else:
        _kernels.set_isa(_kernels.best_isa())
    _kernels.set_num_threads(_default_threads())


def set_num_threads(n: int) -> None:
    """Threads every kernel uses from now on (process-wide)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"set_num_threads: n must be a positive integer, got {n!r}")
    _kernels.set_num_threads(n)


def get_num_threads() -> int:
    return _kernels.get_num_threads()


def config() -> dict:
    """The build and runtime configuration as a dict (what show_config prints)."""
    return {
        "version": __version__,
        "isa": _kernels.active_isa(),
        "isa_compiled": _kernels.compiled_isas(),
        "isa_usable": _kernels.usable_isas(),
        "cpu_features": _kernels.cpu_features(),
        "threads": _kernels.get_num_threads(),
        "openmp": _kernels.have_openmp(),
        "compiler": _kernels.compiler(),
    }


def show_config(file=None) -> None:
    """Print the active ISA, CPU features, threads, compiler/OpenMP and version."""
    c = config()
    openmp = "yes" if c["openmp"] else "no (built serial: the compiler had no OpenMP)"
    lines = [
        f"cortiq {c['version']}",
        f"  isa:          {c['isa']}  (compiled: {', '.join(c['isa_compiled'])}; "
        f"usable here: {', '.join(c['isa_usable'])})",
        f"  cpu features: {' '.join(c['cpu_features']) or '(none detected)'}",
        f"  threads:      {c['threads']}",
        f"  openmp:       {openmp}",
        f"  compiler:     {c['compiler']}",
    ]
    print("\n".join(lines), file=file)


_init()
