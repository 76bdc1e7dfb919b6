"""Process-wide settings, and every environment variable cortiq reads.

Settings: which kernel table runs, how many threads it uses, the default precision of
the activations (exact float32, int8, or auto), and whether LLM() preloads model files
by default. Read once at import from CORTIQ_ISA, CORTIQ_NUM_THREADS, CORTIQ_SPIN_US,
CORTIQ_PRECISION (and its alias CORTIQ_INT8_ACT) and CORTIQ_PRELOAD; changed later
through cortiq.set_num_threads() / cortiq.set_precision() (per model: LLM(path,
precision=..., preload=...)). A forced ISA that cannot run here is an error, never a
silent fallback.

The other variables are read where they apply, through `env` / `env_values` here:
CORTIQ_DEVICE and CORTIQ_GPU_SUBGROUPS (gpu.device), CORTIQ_GPU_ATTN_SPLITS (gpu.dory),
CORTIQ_CACHE (with XDG_CACHE_HOME, model_cache), CORTIQ_API_KEY (the server's keys,
`api_keys_from_env`)
and Dory's CORTIQ_DORY_* (models.dory.config). Their names
before the CORTIQ_ prefix (`RENAMED`) are still read, with a DeprecationWarning naming
the new one.
"""
import os
import sys
import warnings
from collections.abc import Iterable, Mapping
from types import FrameType

from . import _kernels
from ..errors import ConfigError

#: variables renamed to the CORTIQ_ prefix: new name -> the old name, still read when
#: the new one is unset (a DeprecationWarning, once per process and name)
RENAMED = {
    "CORTIQ_DORY_LOOPS": "CMF_DORY_LOOPS",
    "CORTIQ_DORY_KV": "CMF_DORY_KV",
    "CORTIQ_DORY_GATE": "CMF_DORY_GATE",
    "CORTIQ_DORY_PROMPT_LOOPS": "CMF_DORY_PROMPT_LOOPS",
    "CORTIQ_DORY_FULL_WINDOW": "CMF_DORY_FULL_WINDOW",
    "CORTIQ_DORY_O1": "CMF_DORY_O1",
    "CORTIQ_DORY_EXACT": "CMF_DORY_EXACT",
    "CORTIQ_DORY_EXACT_FEATURES": "CMF_DORY_EXACT_FEATURES",
    "CORTIQ_DORY_EXACT_LOG": "CMF_DORY_EXACT_LOG",
    "CORTIQ_DORY_O1_SPILL": "CMF_O1_SPILL",
}
_warned: set = set()   # old names already warned about in this process


def _outside_package_stacklevel() -> int:
    """The `stacklevel` of the caller's first frame outside the cortiq package, so a
    warning points at the user's line (where Python's default filters show it)."""
    package = sys.modules[__name__.partition(".")[0]].__file__ or __file__
    root = os.path.dirname(os.path.abspath(package)) + os.sep
    level = 1
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(root):
        frame = frame.f_back
        level += 1
    return level


def env(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of environment variable `name` (None when unset), from `os.environ` or
    from `environ` when given. A renamed variable whose new name is unset is read under
    its old name, with a DeprecationWarning naming the new one."""
    source = os.environ if environ is None else environ
    value = source.get(name)
    old = RENAMED.get(name)
    if value is None and old is not None and old in source:
        value = source[old]
        if old not in _warned:
            _warned.add(old)
            warnings.warn(f"environment variable {old} is deprecated: set {name} instead",
                          DeprecationWarning, stacklevel=_outside_package_stacklevel())
    return value


def env_values(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict:
    """`{name: value}` for each of `names` that is set (`env`'s rules)."""
    found = {n: env(n, environ) for n in names}
    return {n: v for n, v in found.items() if v is not None}


__version__ = "0.1.0"

_BOOL_WORDS = {"1": True, "0": False, "true": True, "false": False, "yes": True, "no": False,
               "on": True, "off": False}
_preload: bool | None = None  # CORTIQ_PRELOAD; None: unset


def _default_threads() -> int:
    raw = (env("CORTIQ_NUM_THREADS") or "").strip()
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
    forced = (env("CORTIQ_ISA") or "").strip().lower()
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
    raw = (env("CORTIQ_SPIN_US") or "").strip()
    if raw:
        if not raw.isdigit():
            raise ConfigError(f"CORTIQ_SPIN_US must be a whole number of microseconds, got {raw!r}")
        _kernels.set_pool_spin_us(int(raw))
    _kernels.set_default_precision(_env_precision())
    global _preload
    raw = (env("CORTIQ_PRELOAD") or "").strip()
    if raw and raw.lower() not in _BOOL_WORDS:
        raise ConfigError(f"CORTIQ_PRELOAD must be one of {'/'.join(_BOOL_WORDS)}, got {raw!r}")
    _preload = _BOOL_WORDS.get(raw.lower()) if raw else None


PRECISIONS = ("exact", "int8", "auto")


def _env_precision() -> str:
    """CORTIQ_PRECISION, or CORTIQ_INT8_ACT (1 = int8, 0 = exact), else "auto"."""
    raw = (env("CORTIQ_PRECISION") or "").strip().lower()
    if raw and raw not in PRECISIONS:
        raise ConfigError(f"CORTIQ_PRECISION must be one of {', '.join(PRECISIONS)}, got {raw!r}")
    alias = (env("CORTIQ_INT8_ACT") or "").strip()
    if alias not in ("", "0", "1"):
        raise ConfigError(f"CORTIQ_INT8_ACT must be 0 or 1, got {alias!r}")
    if alias:
        from_alias = "int8" if alias == "1" else "exact"
        if raw and raw != from_alias:
            raise ConfigError(f"CORTIQ_PRECISION={raw} and CORTIQ_INT8_ACT={alias} disagree")
        return from_alias
    return raw or "auto"


def check_precision(p, what: str = "precision"):
    """p itself when it is None or one of PRECISIONS, else ConfigError."""
    if p is not None and p not in PRECISIONS:
        raise ConfigError(f"{what}: expected one of {', '.join(PRECISIONS)}, got {p!r}")
    return p


def set_precision(p: str) -> None:
    """The default precision of the activations, process-wide: what every model loaded
    without precision= uses from now on (already loaded ones included).

    "exact": float32 activations (the kernels' exactness contract, what parity with
    float references needs). "int8": x quantized per group of 32 to int8 and integer products for
    q8_row, q8_2f, q4_block, q4_tiled, q4tp and q2tp (faster, ~0.5-1 % relative error
    per product). "auto" (the default): int8 for the 4-bit-and-below dtypes, whose own
    quantization error dominates; for q8_row / q8_2f int8 in the products of a prompt
    chunk (prefill, bound by arithmetic, 2-3x faster in integers) and exact in decode
    (bound by memory; one row or several sequences' rows batched); f16 / bf16 / f32
    exact. Measured error and speed: docs/PERFORMANCE.md. A QTensor made by hand has its
    own precision (exact unless given)."""
    if p not in PRECISIONS:
        raise ConfigError(f"set_precision: expected one of {', '.join(PRECISIONS)}, got {p!r}")
    _kernels.set_default_precision(p)


def get_precision() -> str:
    return _kernels.get_default_precision()


def api_keys_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """The server's API keys in CORTIQ_API_KEY (comma-separated; unset or blank: none)."""
    value = env("CORTIQ_API_KEY", environ) or ""
    return [k.strip() for k in value.split(",") if k.strip()]


def preload_default(long_running: bool = False) -> bool | None:
    """What LLM(path) does without preload=: CORTIQ_PRELOAD as read at import; unset,
    True for a long-running process (`cortiq serve`, which pays the copy once and decodes
    faster ever after), else None: decided per file by `cmf.worth_preloading` (copied
    where the copy gets huge pages and the file fits in memory with room to spare)."""
    if _preload is not None:
        return _preload
    return True if long_running else None


def set_num_threads(n: int) -> None:
    """Threads every kernel uses from now on (process-wide): the calling thread plus
    n - 1 workers of the kernel pool, started or stopped at the next parallel kernel."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"set_num_threads: n must be a positive integer, got {n!r}")
    _kernels.set_num_threads(n)


def get_num_threads() -> int:
    return _kernels.get_num_threads()


def set_int8_activations(on: bool) -> None:
    """The older switch: True is set_precision("int8"), False set_precision("exact")."""
    if not isinstance(on, bool):
        raise ConfigError(f"set_int8_activations: expected True or False, got {on!r}")
    set_precision("int8" if on else "exact")


def get_int8_activations() -> bool:
    """Whether the default precision is "int8"."""
    return get_precision() == "int8"


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
        "precision": get_precision(),
        "int8_activations": get_int8_activations(),
        "prompt_int8_dtypes": list(_kernels.prompt_int8_dtypes()),
        "preload": "auto" if preload_default() is None else preload_default(),
        "pool": {"threads": _kernels.get_num_threads(), "workers": _kernels.pool_workers(),
                 "spin_us": _kernels.pool_spin_us(), "stalls": _kernels.pool_stalls()},
        "compiler": _kernels.compiler(),
    }


def _precision_words(precision: str, prompt_int8) -> str:
    """Which CMF dtypes' products take int8 activations under `precision`, in decode and
    in prompt chunks (`prompt_int8`: _kernels.prompt_int8_dtypes(); the x86 tables
    without a vpdpbusd multiply prompt chunks in float32 whatever the precision)."""
    if precision == "exact":
        return "float32 activations everywhere"
    takes = _kernels.I8_DTYPES if precision == "int8" else _kernels.AUTO_I8_DTYPES
    decode = [d for d in takes if d not in _kernels.GGML_DTYPES]
    prompt = [d for d in _kernels.I8_DTYPES if d in prompt_int8 and d not in _kernels.GGML_DTYPES] \
        or ["none (no vpdpbusd on this CPU)"]
    return (f"int8 activations in decode for {' '.join(decode)}, in prompt chunks for "
            f"{' '.join(prompt)}, in both for the ggml formats; float32 for the rest")


def _onoff(value) -> str:
    return "auto" if value in (None, "auto") else "on" if value else "off"


def config_lines() -> list[str]:
    """The lines show_config prints about the build, the CPU kernels, threads, precision
    and preload (the GPU adapters are listed by the layer that knows them, gpu.device)."""
    c = config()
    pool = c["pool"]
    lines = [
        f"cortiq {c['version']}",
        (f"  isa:          {c['isa']}  (compiled: {', '.join(c['isa_compiled'])}; "
         f"usable here: {', '.join(c['isa_usable'])})"),
        f"  cpu features: {' '.join(c['cpu_features']) or '(none detected)'}",
        f"  L1 data:      {c['l1d_bytes'] // 1024} KiB",
        (f"  threads:      {c['threads']}  (the caller + {c['threads'] - 1} pool workers; "
         f"{pool['workers']} started)"),
        (f"  wait policy:  idle workers spin {pool['spin_us']} us, then sleep (CORTIQ_SPIN_US); "
         f"{pool['stalls']} calls met a descheduled worker"),
        (f"  precision:    {c['precision']}  "
         f"({_precision_words(c['precision'], c['prompt_int8_dtypes'])}; "
         f"CORTIQ_PRECISION, set_precision, LLM(precision=...))"),
        (f"  preload:      {_onoff(c['preload'])}  (LLM default, CORTIQ_PRELOAD; auto: "
         f"copied where huge pages are offered and the file takes at most half the "
         f"available memory; cortiq serve: {_onoff(preload_default(long_running=True))})"),
        f"  compiler:     {c['compiler']}",
    ]
    return lines


_init()
