"""Dory's configuration: the CMF header record and the runtime options.

``DoryConfig.from_header(header)`` reads the generic ``arch`` keys (docs/cmf-format.md §4.1) and
the ``arch.dory`` record whose field names are the reference engine's (``DoryConfig`` in
cortiq_core, as read by ``Dory::from_model``)::

    "arch": {"arch_name": "dory", "hidden_size": 2560, "intermediate_size": 7168,
             "num_layers": 72, "num_attention_heads": 16, "num_kv_heads": 4,
             "head_dim": 256, "vocab_size": 131072, "max_position_embeddings": ...,
             "dory": {"layer_pattern": "S-S-S-*-...", "n_input_layers": 16,
                      "n_recurrent_layers": 40, "n_output_layers": 16,
                      "n_recurrent_loops": 2, "recurrent_kv_cache_mode": "per_loop",
                      "sliding_window": 1024, "rope_theta_full": ..., "rope_theta_sliding": ...,
                      "initializer_range": 0.02, "ngpt_alpha_init": 0.05,
                      "gate_logit_scale_init": 50.596, "turbo": {...} (optional)}}

Everything is validated up front; a bad value raises ``cortiq.errors.ConfigError`` whose
message starts with the field's path (``arch.dory.layer_pattern: ...``).

Defaults where the reference engine's struct has a plain field but files might omit it (none
are known to): ``recurrent_kv_cache_mode`` "per_loop" (the HF default), ``gate_logit_scale_init``
sqrt(hidden_size) (vLLM's rule for null), ``turbo`` absent. Everything else is required.

``DoryOptions`` holds the runtime keyword options (``loops``, ``kv_mode``, ``gate``,
``prompt_loops``, ``full_window``); ``DoryOptions.resolve(config, env)`` applies the
reference engine's precedence: keyword > ``CORTIQ_DORY_*`` environment variable > the
turbo record's defaults > the file's record. It reads the environment once
(``read_env``, through ``cortiq.kernels._config.env_values``; the variables' older ``CMF_DORY_*``
/ ``CMF_O1_SPILL`` names still count, with a DeprecationWarning), for the far field's
variables too, which ``ResolvedOptions.env`` carries to ``cortiq.models.dory.far_field``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...kernels._config import env_values
from ...errors import ConfigError

ARCH_NAME = "dory"
#: The most loops a request may ask for (the reference engine's ``MAX_LOOPS``).
MAX_LOOPS = 16
#: Keys a sealed token reads exactly (``MAX_NEAR``): o1 window + sinks + exact rows.
MAX_NEAR = 8192
#: ``justnorm``'s epsilon (the reference engine's ``EPS``).
EPS = 1e-6
KV_MODES = ("per_loop", "last_loop")
PATTERN_CHARS = {"S": "sliding attention", "*": "full attention", "-": "SwiGLU MLP"}

# The environment variables a Dory model reads: once, when DoryOptions.resolve builds
# its options (``read_env``); model code reads the options, never os.environ.
ENV_LOOPS = "CORTIQ_DORY_LOOPS"
ENV_KV = "CORTIQ_DORY_KV"
ENV_GATE = "CORTIQ_DORY_GATE"
ENV_PROMPT_LOOPS = "CORTIQ_DORY_PROMPT_LOOPS"
ENV_FULL_WINDOW = "CORTIQ_DORY_FULL_WINDOW"
# the far field's (cortiq.models.dory.far_field resolves them from ResolvedOptions.env):
ENV_O1 = "CORTIQ_DORY_O1"                          # "m,w,sink,seal" or "off"
ENV_EXACT = "CORTIQ_DORY_EXACT"                    # "FILE:rows": the exact-row scorer
ENV_EXACT_FEATURES = "CORTIQ_DORY_EXACT_FEATURES"  # a path: the exact-row features, dumped
ENV_EXACT_LOG = "CORTIQ_DORY_EXACT_LOG"            # a path: the exact-row scores, dumped
ENV_SPILL = "CORTIQ_DORY_O1_SPILL"                 # a directory: sealed rows spill there
ENV_VARS = (ENV_LOOPS, ENV_KV, ENV_GATE, ENV_PROMPT_LOOPS, ENV_FULL_WINDOW,
            ENV_O1, ENV_EXACT, ENV_EXACT_FEATURES, ENV_EXACT_LOG, ENV_SPILL)


def read_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Dory variables that are set, as ``{name: value}`` under their CORTIQ_ names:
    from ``os.environ``, or from ``env`` when given (tests pass a dict)."""
    return env_values(ENV_VARS, env)


# ------------------------------------------------------------------ field readers

def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _get(rec: Mapping, key: str, where: str, default: Any = ...) -> Any:
    if key not in rec or rec[key] is None:
        if default is ...:
            raise ConfigError(f"{where}.{key}: missing (required)")
        return default
    return rec[key]


def _int(rec: Mapping, key: str, where: str, lo: int = 0, hi: int | None = None,
         default: Any = ...) -> int:
    v = _get(rec, key, where, default)
    if not _is_int(v):
        raise ConfigError(f"{where}.{key}: {v!r} is not an integer")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ConfigError(f"{where}.{key}: {v} is out of range (want {rng})")
    return v


def _num(rec: Mapping, key: str, where: str, positive: bool = True, default: Any = ...) -> float:
    v = _get(rec, key, where, default)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{where}.{key}: {v!r} is not a number")
    v = float(v)
    if not math.isfinite(v) or (positive and v <= 0):
        want = "a finite number > 0" if positive else "a finite number"
        raise ConfigError(f"{where}.{key}: {v} is not {want}")
    return v


# ------------------------------------------------------------------ the turbo record

@dataclass(frozen=True)
class DoryTurbo:
    """cortiq's acceleration record (``turbo``): early-exit bias, far-field shape,
    exact-row budget. Semantics live in the reference engine; only the fields are checked here."""
    exit_bias: float
    o1: tuple[int, int, int, int]          # m (landmarks), w (exact window), sink, seal
    exact_rows: int = 0

    @property
    def seal(self) -> int:
        """The seal position as the reference engine uses it: at least window + sinks + 16."""
        _m, w, sink, seal = self.o1
        return max(seal, w + sink + 16)

    @classmethod
    def from_record(cls, rec: Any, where: str = "arch.dory.turbo") -> DoryTurbo:
        if not isinstance(rec, Mapping):
            raise ConfigError(f"{where}: {type(rec).__name__} is not an object")
        o1 = _get(rec, "o1", where)
        if (not isinstance(o1, (list, tuple)) or len(o1) != 4
                or not all(_is_int(x) and x >= 0 for x in o1)):
            raise ConfigError(f"{where}.o1: {o1!r} is not [m, w, sink, seal] (4 integers >= 0)")
        return cls(exit_bias=_num(rec, "exit_bias", where, positive=False),
                   o1=tuple(int(x) for x in o1),  # type: ignore[arg-type]  # 4, checked above
                   exact_rows=_int(rec, "exact_rows", where, 0, default=0))

    def to_record(self) -> dict:
        return {"exit_bias": self.exit_bias, "o1": list(self.o1), "exact_rows": self.exact_rows}


# ------------------------------------------------------------------ the config

@dataclass(frozen=True)
class DoryConfig:
    """Validated Dory geometry + record. Field names follow the CMF header."""
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    layer_pattern: str
    n_input_layers: int
    n_recurrent_layers: int
    n_output_layers: int
    n_recurrent_loops: int
    recurrent_kv_cache_mode: str
    sliding_window: int
    rope_theta_full: float
    rope_theta_sliding: float
    initializer_range: float
    ngpt_alpha_init: float
    gate_logit_scale_init: float
    turbo: DoryTurbo | None = None
    arch_name: str = ARCH_NAME

    # -------------------------------------------------------------- construction
    @classmethod
    def from_header(cls, header: Mapping) -> DoryConfig:
        """From a whole CMF header dict (``header["arch"]`` holds the keys)."""
        if not isinstance(header, Mapping):
            raise ConfigError(f"header: {type(header).__name__} is not an object")
        arch = header.get("arch")
        if not isinstance(arch, Mapping):
            raise ConfigError("arch: missing or not an object")
        return cls.from_arch(arch)

    @classmethod
    def from_arch(cls, arch: Mapping) -> DoryConfig:
        """From the header's ``arch`` object."""
        w = "arch"
        name = _get(arch, "arch_name", w)
        if name != ARCH_NAME:
            raise ConfigError(f"arch.arch_name: {name!r} is not {ARCH_NAME!r}")
        rec = arch.get("dory")
        if not isinstance(rec, Mapping):
            raise ConfigError("arch.dory: missing or not an object (no Dory record)")
        d = "arch.dory"
        hidden = _int(arch, "hidden_size", w, 1)
        turbo = rec.get("turbo")
        cfg = cls(
            hidden_size=hidden,
            intermediate_size=_int(arch, "intermediate_size", w, 1),
            num_layers=_int(arch, "num_layers", w, 1),
            num_attention_heads=_int(arch, "num_attention_heads", w, 1),
            num_kv_heads=_int(arch, "num_kv_heads", w, 1),
            head_dim=_int(arch, "head_dim", w, 2),
            vocab_size=_int(arch, "vocab_size", w, 1),
            max_position_embeddings=_int(arch, "max_position_embeddings", w, 1),
            layer_pattern=_get(rec, "layer_pattern", d),
            n_input_layers=_int(rec, "n_input_layers", d, 0),
            n_recurrent_layers=_int(rec, "n_recurrent_layers", d, 0),
            n_output_layers=_int(rec, "n_output_layers", d, 0),
            n_recurrent_loops=_int(rec, "n_recurrent_loops", d, 1, MAX_LOOPS),
            recurrent_kv_cache_mode=_get(rec, "recurrent_kv_cache_mode", d, "per_loop"),
            sliding_window=_int(rec, "sliding_window", d, 0),
            rope_theta_full=_num(rec, "rope_theta_full", d),
            rope_theta_sliding=_num(rec, "rope_theta_sliding", d),
            initializer_range=_num(rec, "initializer_range", d),
            ngpt_alpha_init=_num(rec, "ngpt_alpha_init", d),
            gate_logit_scale_init=_num(rec, "gate_logit_scale_init", d,
                                       default=math.sqrt(hidden)),
            turbo=None if turbo is None else DoryTurbo.from_record(turbo),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Cross-field checks; ConfigError names the field at fault."""
        d = "arch.dory"
        p = self.layer_pattern
        if not isinstance(p, str):
            raise ConfigError(f"{d}.layer_pattern: {p!r} is not a string")
        bad = sorted(set(p) - set(PATTERN_CHARS))
        if bad:
            raise ConfigError(f"{d}.layer_pattern: characters {''.join(bad)!r} are not "
                              f"S (sliding), * (full) or - (MLP)")
        if len(p) != self.num_layers:
            raise ConfigError(f"{d}.layer_pattern: {len(p)} characters for "
                              f"arch.num_layers = {self.num_layers}")
        total = self.n_input_layers + self.n_recurrent_layers + self.n_output_layers
        if total != self.num_layers:
            raise ConfigError(
                f"{d}.n_recurrent_layers: n_input_layers {self.n_input_layers} + "
                f"n_recurrent_layers {self.n_recurrent_layers} + n_output_layers "
                f"{self.n_output_layers} = {total}, not arch.num_layers = {self.num_layers}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ConfigError(f"arch.num_kv_heads: {self.num_kv_heads} does not divide "
                              f"num_attention_heads = {self.num_attention_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"arch.head_dim: {self.head_dim} is odd (half-split RoPE)")
        if self.recurrent_kv_cache_mode not in KV_MODES:
            raise ConfigError(f"{d}.recurrent_kv_cache_mode: {self.recurrent_kv_cache_mode!r}; "
                              f"allowed: {', '.join(KV_MODES)}")
        if "S" in p and self.sliding_window <= 0:
            raise ConfigError(f"{d}.sliding_window: {self.sliding_window}; sliding (S) layers "
                              f"need a window > 0")
        if not 1 <= self.n_recurrent_loops <= MAX_LOOPS:
            raise ConfigError(f"{d}.n_recurrent_loops: {self.n_recurrent_loops} is out of "
                              f"range (want in 1..{MAX_LOOPS})")
        if self.turbo is not None:
            _m, w, sink, _ = self.turbo.o1
            if w + sink + self.turbo.exact_rows > MAX_NEAR:
                raise ConfigError(f"{d}.turbo.exact_rows: window {w} + sinks {sink} + exact "
                                  f"rows {self.turbo.exact_rows} exceed {MAX_NEAR}")

    def to_arch(self, **generic: Any) -> dict:
        """The header ``arch`` object for this config (what the converter writes).
        ``generic`` adds/overrides generic keys (e.g. ``rms_norm_eps``, ``rope_theta``)."""
        layer_types = ["SlidingAttention" if ch == "S" else "FullAttention"
                       for ch in self.layer_pattern]
        arch = {
            "arch_name": ARCH_NAME,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "layer_types": layer_types,
            "rms_norm_eps": EPS,
            "rope_theta": self.rope_theta_full,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
        }
        if "S" in self.layer_pattern:
            arch["sliding_window"] = self.sliding_window
            arch["rope_local_base_freq"] = self.rope_theta_sliding
        arch.update(generic)
        rec = {
            "layer_pattern": self.layer_pattern,
            "n_input_layers": self.n_input_layers,
            "n_recurrent_layers": self.n_recurrent_layers,
            "n_output_layers": self.n_output_layers,
            "n_recurrent_loops": self.n_recurrent_loops,
            "recurrent_kv_cache_mode": self.recurrent_kv_cache_mode,
            "sliding_window": self.sliding_window,
            "rope_theta_full": self.rope_theta_full,
            "rope_theta_sliding": self.rope_theta_sliding,
            "initializer_range": self.initializer_range,
            "ngpt_alpha_init": self.ngpt_alpha_init,
            "gate_logit_scale_init": self.gate_logit_scale_init,
        }
        if self.turbo is not None:
            rec["turbo"] = self.turbo.to_record()
        arch["dory"] = rec
        return arch

    # -------------------------------------------------------------- geometry
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA): q head h reads kv head h // group."""
        return self.num_attention_heads // self.num_kv_heads

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def input_layers(self) -> range:
        return range(self.n_input_layers)

    @property
    def recurrent_layers(self) -> range:
        return range(self.n_input_layers, self.n_input_layers + self.n_recurrent_layers)

    @property
    def output_layers(self) -> range:
        return range(self.n_input_layers + self.n_recurrent_layers, self.num_layers)

    def is_recurrent(self, layer: int) -> bool:
        return layer in self.recurrent_layers

    @property
    def attention_layers(self) -> list[int]:
        """Physical indices of the attention sub-layers; position = the KV ordinal."""
        return [i for i, ch in enumerate(self.layer_pattern) if ch != "-"]

    def kv_slots(self, loops: int | None = None, kv_mode: str | None = None) -> int:
        """How many KV caches a sequence needs (36 for the release under last_loop)."""
        loops = self.n_recurrent_loops if loops is None else loops
        mode = kv_mode or self.recurrent_kv_cache_mode
        n = 0
        for i in self.attention_layers:
            n += loops if (mode == "per_loop" and self.is_recurrent(i)) else 1
        return n

    # -------------------------------------------------------------- load-time transforms
    # The reference engine folds these into f32 vectors at load: factor in f64, cast to f32,
    # then f32 arithmetic. The file stores the raw HF values.
    @property
    def gate_init(self) -> float:
        return self.gate_logit_scale_init

    def alpha_scale(self, raw: np.ndarray) -> np.ndarray:
        """``|alpha * alpha0/sigma0|`` -- attn_alpha / mlp_alpha -> residual step sizes."""
        f = np.float32(self.ngpt_alpha_init / self.initializer_range)
        return np.abs(np.asarray(raw, np.float32) * f)

    def sqk_scale(self, raw: np.ndarray) -> np.ndarray:
        """``(sqk * sqrt(hd)/sigma0)^2`` -- per q head-dim scale applied after norm."""
        f = np.float32(math.sqrt(self.head_dim) / self.initializer_range)
        s = np.asarray(raw, np.float32) * f
        return s * s

    def s_gate_scale(self, raw: np.ndarray) -> np.ndarray:
        """``(s_gate * sqrt(g0)/sigma0)^2`` -- the output gate's logit scale."""
        s = np.asarray(raw, np.float32) * np.float32(
            math.sqrt(self.gate_logit_scale_init) / self.initializer_range)
        return s * s

    def suv_scale(self, raw: np.ndarray) -> np.ndarray:
        """``suv * sqrt(hidden)`` -- suv_gate / suv_up."""
        return np.asarray(raw, np.float32) * np.float32(math.sqrt(self.hidden_size))

    def logit_scale(self, raw: np.ndarray) -> np.ndarray:
        """``logit_scale / sigma0`` (the reference engine multiplies by the f32 of 1/sigma0)."""
        return np.asarray(raw, np.float32) * (np.float32(1.0) / np.float32(self.initializer_range))


# ------------------------------------------------------------------ runtime options

@dataclass(frozen=True)
class DoryGate:
    """How a token may leave the loop early: ``conf`` (top probability after one pass
    >= threshold), ``recon`` (a router file + bias), ``auto`` (the file's router, else
    conf 0.7), ``file`` (the turbo record's router with its exit bias)."""
    kind: str
    threshold: float | None = None
    path: str | None = None
    bias: float | None = None


def parse_gate(value: Any, where: str = "gate") -> DoryGate | None:
    """``None`` | ``"auto"`` | ``"conf:T"`` (0 < T <= 1) | ``"recon:FILE:BIAS"``."""
    if value is None or isinstance(value, DoryGate):
        return value
    allowed = "'auto', 'conf:<threshold in (0, 1]>' or 'recon:<file>:<bias>'"
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {value!r}; allowed: {allowed}")
    s = value.strip()
    if s == "auto":
        return DoryGate("auto")
    kind, _, rest = s.partition(":")
    if kind == "conf":
        try:
            t = float(rest)
        except ValueError:
            t = float("nan")
        if not 0.0 < t <= 1.0:
            raise ConfigError(f"{where}: {value!r}: the confidence threshold must be in (0, 1]")
        return DoryGate("conf", threshold=t)
    if kind == "recon":
        path, _, bias = rest.rpartition(":")
        try:
            b = float(bias)
        except ValueError:
            b = float("nan")
        if not path or not math.isfinite(b):
            raise ConfigError(f"{where}: {value!r}: want recon:<file>:<bias>")
        return DoryGate("recon", path=path, bias=b)
    raise ConfigError(f"{where}: {value!r}; allowed: {allowed}")


@dataclass(frozen=True)
class ResolvedOptions:
    """What a Dory forward runs with, after keywords, environment and file defaults."""
    loops: int
    kv_mode: str
    gate: DoryGate | None
    prompt_loops: int
    full_window: int | None
    #: a loop count was asked for (keyword or CORTIQ_DORY_LOOPS): the turbo record's
    #: defaults (its far field included) do not apply
    fixed_loops: bool = False
    #: the Dory variables as read (``read_env``), for the far field's options
    env: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)


_UNSET: Any = object()


def _opt_int(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    rng = f"an integer >= {lo}" if hi is None else f"an integer in {lo}..{hi}"
    if isinstance(value, str):
        try:
            value = int(value.strip(), 10)
        except ValueError:
            raise ConfigError(f"{name}: {value!r} is not {rng}") from None
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        raise ConfigError(f"{name}: {value!r} is not {rng}")
    return int(value)


def _opt_kv(value: Any, name: str) -> str:
    if value not in KV_MODES:
        raise ConfigError(f"{name}: {value!r}; allowed: {', '.join(KV_MODES)}")
    return value


@dataclass(frozen=True)
class DoryOptions:
    """Runtime keyword options. ``None`` = not given (the environment variable, then the
    file decide). Values are checked here, so a bad keyword fails before any loading.

    * ``loops``: passes of the recurrent block, 0..16 (``CORTIQ_DORY_LOOPS``; the reference engine
      accepts 0 there, which runs the output block on the input block's state).
    * ``kv_mode``: "per_loop" | "last_loop" (``CORTIQ_DORY_KV``).
    * ``gate``: early exit -- "auto" | "conf:T" | "recon:FILE:BIAS" (``CORTIQ_DORY_GATE``).
    * ``prompt_loops``: passes over prompt chunks whose logits nobody reads, under
      last_loop; 0 = as many as any chunk (``CORTIQ_DORY_PROMPT_LOOPS``).
    * ``full_window``: full layers read at most this many keys (``CORTIQ_DORY_FULL_WINDOW``).
    """
    loops: int | None = None
    kv_mode: str | None = None
    gate: Any = None
    prompt_loops: int | None = None
    full_window: int | None = None

    def __post_init__(self):
        if self.loops is not None:
            _opt_int(self.loops, "loops", 0, MAX_LOOPS)
        if self.kv_mode is not None:
            _opt_kv(self.kv_mode, "kv_mode")
        object.__setattr__(self, "gate", parse_gate(self.gate, "gate"))
        if self.prompt_loops is not None:
            _opt_int(self.prompt_loops, "prompt_loops", 0, MAX_LOOPS)
        if self.full_window is not None:
            _opt_int(self.full_window, "full_window", 1)

    def resolve(self, config: DoryConfig, env: Mapping[str, str] | None = None) -> ResolvedOptions:
        """Apply keyword > environment > turbo defaults > file record, as the reference engine does.

        A turbo file runs "turbo" (last_loop, the file's router as gate, prompt loops 1)
        unless a fixed loop count is asked for (keyword ``loops`` or ``CORTIQ_DORY_LOOPS``);
        an explicit kv mode / prompt_loops still wins over the turbo default.
        """
        env = read_env(env)

        def from_env(name: str) -> str | None:
            v = env.get(name)
            return None if v is None or v.strip() == "" else v.strip()

        loops = self.loops
        if loops is None and from_env(ENV_LOOPS) is not None:
            loops = _opt_int(from_env(ENV_LOOPS), ENV_LOOPS, 0, MAX_LOOPS)
        kv = self.kv_mode
        if kv is None and from_env(ENV_KV) is not None:
            kv = _opt_kv(from_env(ENV_KV), ENV_KV)
        gate = self.gate
        auto = gate is not None and gate.kind == "auto"
        if gate is None and from_env(ENV_GATE) is not None:
            gate = parse_gate(from_env(ENV_GATE), ENV_GATE)
            auto = gate is not None and gate.kind == "auto"
        prompt_loops = self.prompt_loops
        if prompt_loops is None and from_env(ENV_PROMPT_LOOPS) is not None:
            prompt_loops = _opt_int(from_env(ENV_PROMPT_LOOPS), ENV_PROMPT_LOOPS, 0, MAX_LOOPS)
        full_window = self.full_window
        if full_window is None and from_env(ENV_FULL_WINDOW) is not None:
            full_window = _opt_int(from_env(ENV_FULL_WINDOW), ENV_FULL_WINDOW, 1)

        fixed_loops = loops is not None
        if config.turbo is not None and not fixed_loops:
            if kv is None:
                kv = "last_loop"
            if (gate is None or auto) and kv == "last_loop":
                gate = DoryGate("file", bias=config.turbo.exit_bias)
            if prompt_loops is None:
                prompt_loops = 1
        if gate is not None and gate.kind == "auto":
            gate = DoryGate("conf", threshold=0.7)   # no router in the file
        return ResolvedOptions(
            loops=config.n_recurrent_loops if loops is None else loops,
            kv_mode=kv or config.recurrent_kv_cache_mode,
            gate=gate,
            prompt_loops=prompt_loops or 0,
            full_window=full_window,
            fixed_loops=fixed_loops,
            env=env,
        )
