"""Process-wide settings: which kernel table runs, how many threads it uses,
whether the q4 matvecs may quantize their activations to int8, and whether LLM()
preloads model files by default.

Read once at import from CORTIQ_ISA, CORTIQ_NUM_THREADS, CORTIQ_SPIN_US,
CORTIQ_INT8_ACT and CORTIQ_PRELOAD; changed later through cortiq.set_num_threads() /
cortiq.set_int8_activations() (preload: LLM(path, preload=...)). A forced ISA that
cannot run here is an error, never a silent fallback.
"""
import os

from . import _kernels
from .errors import ConfigError

__version__ = "0.1.0"

_BOOL_WORDS = {"1": True, "0": False, "true": True, "false": False, "yes": True, "no": False,
               "on": True, "off": False}
_preload: bool | None = None  # CORTIQ_PRELOAD; None: unset


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
    raw = os.environ.get("CORTIQ_SPIN_US", "").strip()
    if raw:
        if not raw.isdigit():
            raise ConfigError(f"CORTIQ_SPIN_US must be a whole number of microseconds, got {raw!r}")
        _kernels.set_pool_spin_us(int(raw))
    raw = os.environ.get("CORTIQ_INT8_ACT", "").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"CORTIQ_INT8_ACT must be 0 or 1, got {raw!r}")
    _kernels.set_int8_act(raw == "1")
    global _preload
    raw = os.environ.get("CORTIQ_PRELOAD", "").strip()
    if raw and raw.lower() not in _BOOL_WORDS:
        raise ConfigError(f"CORTIQ_PRELOAD must be one of {'/'.join(_BOOL_WORDS)}, got {raw!r}")
    _preload = _BOOL_WORDS.get(raw.lower()) if raw else None


def preload_default(long_running: bool = False) -> bool:
    """What LLM(path) does without preload=: CORTIQ_PRELOAD as read at import; unset,
    off, except for a long-running process (`cortiq serve`), which pays the copy once
    and decodes faster ever after."""
    return long_running if _preload is None else _preload


def set_num_threads(n: int) -> None:
    """Threads every kernel uses from now on (process-wide): the calling thread plus
    n - 1 workers of the kernel pool, started or stopped at the next parallel kernel."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"set_num_threads: n must be a positive integer, got {n!r}")
    _kernels.set_num_threads(n)


def get_num_threads() -> int:
    return _kernels.get_num_threads()


def set_int8_activations(on: bool) -> None:
    """Opt in (or back out) of int8 activations for q4 matrices, process-wide.

    While on, matvec / matvec_many / row_dot / rows_dot of q4_block, q4_tiled and q4tp
    matrices quantize x per group of 32 to int8 (scale max|x| / 127) and sum in
    integers: about 1.5-2x the speed of the exact float32 path where that path is
    compute-bound, at a relative error of a few 1e-3 per dot product (measured in
    docs/ARCHITECTURE.md). Off by default: parity with float32 references holds only
    with it off. Results stay deterministic and identical for any thread count.
    """
    if not isinstance(on, bool):
        raise ConfigError(f"set_int8_activations: expected True or False, got {on!r}")
    _kernels.set_int8_act(on)


def get_int8_activations() -> bool:
    return _kernels.get_int8_act()


def config() -> dict:
    """The build and runtime configuration as a dict (what show_config prints)."""
    return {
        "version": __version__,
        "isa": _kernels.active_isa(),
        "isa_compiled": _kernels.compiled_isas(),
        "isa_usable": _kernels.usable_isas(),
        "cpu_features": _kernels.cpu_features(),
        "l1d_bytes": _kernels.l1d_bytes(),
        "threads": _kernels.get_num_threads(),
        "int8_activations": _kernels.get_int8_act(),
        "preload": preload_default(),
        "pool": {"threads": _kernels.get_num_threads(), "workers": _kernels.pool_workers(),
                 "spin_us": _kernels.pool_spin_us(), "stalls": _kernels.pool_stalls()},
        "compiler": _kernels.compiler(),
    }


def show_config(file=None) -> None:
    """Print the active ISA, CPU features, threads and their pool, compiler and version."""
    c = config()
    pool = c["pool"]
    lines = [
        f"cortiq {c['version']}",
        f"  isa:          {c['isa']}  (compiled: {', '.join(c['isa_compiled'])}; "
        f"usable here: {', '.join(c['isa_usable'])})",
        f"  cpu features: {' '.join(c['cpu_features']) or '(none detected)'}",
        f"  L1 data:      {c['l1d_bytes'] // 1024} KiB",
        f"  threads:      {c['threads']}  (the caller + {c['threads'] - 1} pool workers; "
        f"{pool['workers']} started)",
        f"  wait policy:  idle workers spin {pool['spin_us']} us, then sleep (CORTIQ_SPIN_US); "
        f"{pool['stalls']} calls met a descheduled worker",
        f"  int8 act:     {'on (q4 matvecs quantize x)' if c['int8_activations'] else 'off'}",
        f"  preload:      {'on' if c['preload'] else 'off'}  (LLM default, CORTIQ_PRELOAD; "
        f"cortiq serve: {'on' if preload_default(long_running=True) else 'off'})",
        f"  compiler:     {c['compiler']}",
    ]
    print("\n".join(lines), file=file)


_init()
