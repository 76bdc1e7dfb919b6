"""Hugging Face Dory checkpoint -> CMF v2 file.

Pure parts (no cortiq.cmf needed; unit-tested on their own):

* ``arch_from_hf_config(config)`` -- HF ``config.json`` -> the CMF header ``arch`` object
  (generic keys + ``arch.dory``), refusing what cortiq cannot run with a ConfigError that
  names the ``config.json`` key.
* ``cmf_name(hf_name)`` / ``expected_tensors(cfg)`` / ``plan_tensors(...)`` -- the tensor
  rename (``backbone.`` -> ``model.``, ``backbone.embeddings`` -> ``model.embed_tokens``,
  scale vectors keep their suffix-less names) and the shape check.
* ``find_tokenizer_json`` / ``find_chat_template`` / ``eos_token_ids`` /
  ``tokenizer_bundle`` -- the chat bundle (docs/cmf-format.md §4.4) from the HF directory.

``convert(hf_dir, out_path, quant="q8_row", progress=True)`` streams the tensors one at a
time (read by ``cortiq.convert._safetensors``) into ``cortiq.cmf.write``.

Load-time transforms (docs/models/dory.md §2.2): the reference engine's loader
(``Dory::from_model``) applies every one of them when it loads the file --
``|alpha*alpha0/sigma0|``, ``(sqk*sqrt(hd)/sigma0)^2``, ``(s_gate*sqrt(g0)/sigma0)^2``,
``suv*sqrt(H)``, ``logit_scale/sigma0`` -- so the converter applies **none**: the file
stores the raw HF values (``STORED_RAW``), and ``cortiq.models.dory.config.DoryConfig``
carries sigma0, alpha0 and g0 for the loader.
Scale vectors are 1-D, so docs/cmf-format.md §8 stores them f16 -- lossless for bf16 checkpoints
in f16's normal range; a vector f16 cannot hold exactly (f32 checkpoints, |x| < 2^-14 or
> 65504) is written f32 instead (``vector_dtype``), so the stored raw values are exact.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..cmf.schema import CHAT_END_TOKENS
from ..errors import ConfigError
from ..models.dory.config import ARCH_NAME, EPS, DoryConfig
from ._safetensors import SafetensorsShard, open_checkpoint

CONVERTER = "cortiq.convert.hf_dory"

#: Scale tensors whose raw HF values the file stores; the loader transforms them (seed).
STORED_RAW = {
    "attn_alpha": "|alpha * ngpt_alpha_init / initializer_range|",
    "mlp_alpha": "|alpha * ngpt_alpha_init / initializer_range|",
    "mixer.sqk": "(sqk * sqrt(head_dim) / initializer_range)^2",
    "mixer.s_gate": "(s_gate * sqrt(gate_logit_scale_init) / initializer_range)^2",
    "mixer.suv_gate": "suv_gate * sqrt(hidden_size)",
    "mixer.suv_up": "suv_up * sqrt(hidden_size)",
    "lm_head.logit_scale": "logit_scale / initializer_range",
}

#: HF config.json keys that must hold the value Dory v1 fixes (absent = vLLM's default).
FIXED_FLAGS: dict[str, tuple[Any, Any]] = {
    # key: (required value, default when absent)
    "dory_format_version": (1, 1),
    "ngpt": (True, True),
    "fngpt": (True, True),
    "ngpt_enable_final_norm": (False, False),
    "attention_output_gate": (True, True),
    "attention_bias": (False, False),
    "mlp_bias": (False, False),
    "mlp_hidden_act": ("silu", "silu"),
    "tie_word_embeddings": (False, False),
    "initial_state": ("input_copy", "input_copy"),
    "input_transform": ("residual", "residual"),
    "output_transform": ("replace", "replace"),
    "mixer_type": (None, None),
    "partial_rotary_factor": (1.0, 1.0),
}

#: CMF field -> the config.json key it comes from (for error messages).
HF_KEY = {
    "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers", "num_attention_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads", "head_dim": "attention_head_dim",
    "vocab_size": "vocab_size", "max_position_embeddings": "max_position_embeddings",
    "layer_pattern": "hybrid_layer_pattern", "n_input_layers": "n_input_layers",
    "n_recurrent_layers": "n_recurrent_layers", "n_output_layers": "n_output_layers",
    "n_recurrent_loops": "n_recurrent_loops",
    "recurrent_kv_cache_mode": "recurrent_kv_cache_mode", "sliding_window": "swa_window_size",
    "rope_theta_full": "rope_theta", "rope_theta_sliding": "rope_theta_2",
    "initializer_range": "init_method_std", "ngpt_alpha_init": "ngpt_alpha_init",
    "gate_logit_scale_init": "attention_output_gate_logit_scale_init",
}



# ------------------------------------------------------------------ config

def _bad(key: str, msg: str) -> ConfigError:
    return ConfigError(f"config.json: {key}: {msg}")


def arch_from_hf_config(hf: Mapping) -> dict:
    """HF Dory ``config.json`` dict -> CMF header ``arch`` dict (generic keys + ``dory``)."""
    if not isinstance(hf, Mapping):
        raise ConfigError("config.json: not a JSON object")
    model_type = hf.get("model_type")
    archs = hf.get("architectures") or []
    if model_type != ARCH_NAME and "DoryForCausalLM" not in archs:
        raise _bad("model_type", f"{model_type!r} (architectures {archs}) is not a Dory model")
    for key, (want, default) in FIXED_FLAGS.items():
        got = hf.get(key, default)
        if got != want or isinstance(got, bool) != isinstance(want, bool):
            raise _bad(key, f"{got!r}; cortiq runs Dory only with {key} = {want!r}")

    def need(key):
        if hf.get(key) is None:
            raise _bad(key, "missing (required)")
        return hf[key]

    n = need("num_hidden_layers")
    hidden = need("hidden_size")
    hd = hf.get("attention_head_dim", hf.get("head_dim"))
    if hd is None:
        raise _bad("attention_head_dim", "missing (required; Dory's head_dim is not hidden/heads)")
    if hf.get("head_dim") is not None and hf["head_dim"] != hd:
        raise _bad("head_dim", f"{hf['head_dim']} disagrees with attention_head_dim = {hd}")
    nh, nkv = need("num_attention_heads"), need("num_key_value_heads")
    for swa, full, val in (("swa_num_attention_heads", "num_attention_heads", nh),
                           ("swa_num_key_value_heads", "num_key_value_heads", nkv),
                           ("swa_head_dim", "attention_head_dim", hd)):
        if hf.get(swa) not in (None, val):
            raise _bad(swa, f"{hf[swa]} differs from {full} = {val}; Dory's sliding and full "
                            f"layers share one geometry")
    prf2 = hf.get("partial_rotary_factor_2")
    if prf2 not in (None, 1, 1.0) or isinstance(prf2, bool):
        raise _bad("partial_rotary_factor_2", f"{prf2!r}; cortiq rotates whole heads (1.0)")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise _bad("num_hidden_layers", f"{n!r} is not a positive integer")
    pattern = hf.get("hybrid_layer_pattern")
    if pattern is None:
        pattern = "S-S-S-*-" * (n // 8)
    if not isinstance(pattern, str) or len(pattern) != n or set(pattern) - set("S*-"):
        raise _bad("hybrid_layer_pattern", f"{pattern!r} is not one of S, *, - per layer "
                                           f"({n} layers)")
    no_rope = hf.get("no_rope_layers")
    if no_rope is not None and (len(no_rope) != n or any(no_rope)):
        raise _bad("no_rope_layers", "NoPE layers are not supported (want all zeros)")
    profiles = hf.get("rope_profile_layers")
    if profiles is None:
        profiles = [1] * n
    if len(profiles) != n or any(p not in (1, 2) or isinstance(p, bool) for p in profiles):
        raise _bad("rope_profile_layers", f"{profiles!r}: want one 1 or 2 per layer")
    theta1 = hf.get("rope_theta", 10000.0)
    theta2 = hf.get("rope_theta_2")
    theta2 = theta1 if theta2 is None else theta2
    # cortiq, as the reference engine, keys the RoPE base on the layer kind: every S layer
    # must use one base and every * layer one base, whatever profile numbers carry them.
    kinds: dict[str, set] = {"S": set(), "*": set()}
    for i, ch in enumerate(pattern):
        if ch != "-":
            kinds[ch].add(theta2 if profiles[i] == 2 else theta1)
    for ch, name in (("S", "sliding"), ("*", "full")):
        if len(kinds[ch]) > 1:
            raise _bad("rope_profile_layers",
                       f"the {name} ({ch}) layers use several RoPE bases {sorted(kinds[ch])}; "
                       f"cortiq needs one base per layer kind")
    theta_full = next(iter(kinds["*"]), theta1)
    theta_sliding = next(iter(kinds["S"]), theta2)
    n_in, n_out = hf.get("n_input_layers", 0), hf.get("n_output_layers", 0)
    n_rec = hf.get("n_recurrent_layers")
    if n_rec is None and all(isinstance(v, int) for v in (n, n_in, n_out)):
        n_rec = n - n_in - n_out
    g0 = hf.get("attention_output_gate_logit_scale_init")
    if g0 is None and isinstance(hidden, (int, float)) and hidden > 0:
        g0 = math.sqrt(hidden)
    dory = {
        "layer_pattern": pattern, "n_input_layers": n_in, "n_recurrent_layers": n_rec,
        "n_output_layers": n_out, "n_recurrent_loops": hf.get("n_recurrent_loops", 1),
        "recurrent_kv_cache_mode": hf.get("recurrent_kv_cache_mode", "per_loop"),
        "sliding_window": hf.get("swa_window_size", 0 if "S" not in pattern else None),
        "rope_theta_full": theta_full, "rope_theta_sliding": theta_sliding,
        "initializer_range": hf.get("init_method_std", 0.02),
        "ngpt_alpha_init": hf.get("ngpt_alpha_init", 0.05),
        "gate_logit_scale_init": g0,
    }
    if dory["sliding_window"] is None:
        dory["sliding_window"] = 0   # refused below, under the HF key
    arch = {"arch_name": ARCH_NAME, "hidden_size": hidden,
            "intermediate_size": hf.get("intermediate_size"), "num_layers": n,
            "num_attention_heads": nh, "num_kv_heads": nkv, "head_dim": hd,
            "vocab_size": hf.get("vocab_size"),
            "max_position_embeddings": hf.get("max_position_embeddings", 8192), "dory": dory}
    try:
        cfg = DoryConfig.from_arch(arch)
    except ConfigError as e:
        msg = str(e)
        m = re.match(r"arch(?:\.dory)?\.(\w+)(?:\.\w+)*: (.*)", msg, re.DOTALL)
        if m:
            raise _bad(HF_KEY.get(m.group(1), m.group(1)), m.group(2)) from None
        raise ConfigError(f"config.json: {msg}") from None
    return cfg.to_arch(rms_norm_eps=EPS)


# ------------------------------------------------------------------ tensors

_LAYER = re.compile(r"backbone\.layers\.(\d+)\.(.+)")


def cmf_name(hf_name: str) -> str:
    """HF tensor name -> CMF tensor name (the reference engine's spelling)."""
    if hf_name == "backbone.embeddings.weight":
        return "model.embed_tokens.weight"
    if hf_name in ("lm_head.weight", "lm_head.logit_scale"):
        return hf_name
    m = _LAYER.fullmatch(hf_name)
    if m:
        return f"model.layers.{m.group(1)}.{m.group(2)}"
    raise ConfigError(f"{hf_name}: not a Dory tensor name")


def hf_name(cmf: str) -> str:
    """The inverse of ``cmf_name``."""
    if cmf == "model.embed_tokens.weight":
        return "backbone.embeddings.weight"
    if cmf.startswith("model.layers."):
        return "backbone.layers." + cmf[len("model.layers."):]
    if cmf in ("lm_head.weight", "lm_head.logit_scale"):
        return cmf
    raise ConfigError(f"{cmf}: not a Dory tensor name")


def expected_tensors(cfg: DoryConfig) -> dict[str, tuple[int, ...]]:
    """Every HF tensor a Dory checkpoint holds, in file order, with its shape."""
    H, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    q, kv = cfg.q_size, cfg.kv_size
    out: dict[str, tuple[int, ...]] = {"backbone.embeddings.weight": (V, H)}
    for i, ch in enumerate(cfg.layer_pattern):
        p, m = f"backbone.layers.{i}", f"backbone.layers.{i}.mixer"
        if ch == "-":
            out.update({f"{m}.gate_proj.weight": (F, H), f"{m}.up_proj.weight": (F, H),
                        f"{m}.down_proj.weight": (H, F), f"{m}.suv_gate": (F,),
                        f"{m}.suv_up": (F,), f"{p}.mlp_alpha": (H,)})
        else:
            out.update({f"{m}.q_proj.weight": (q, H), f"{m}.k_proj.weight": (kv, H),
                        f"{m}.v_proj.weight": (kv, H), f"{m}.g_proj.weight": (q, H),
                        f"{m}.o_proj.weight": (H, q), f"{m}.sqk": (q,), f"{m}.s_gate": (q,),
                        f"{p}.attn_alpha": (H,)})
    out["lm_head.weight"] = (V, H)
    out["lm_head.logit_scale"] = (V,)
    return out


_IGNORED = re.compile(r".*rotary_emb\.inv_freq")


def plan_tensors(cfg: DoryConfig,
                 shapes: Mapping[str, tuple[int, ...]]) -> list[tuple[str, str, tuple]]:
    """Check a checkpoint's ``{hf_name: shape}`` against the config: ``[(hf, cmf, shape)]``
    in file order. Missing, unexpected (e.g. a fused ``qkv_proj``) or misshapen tensors
    raise ConfigError naming the tensor."""
    want = expected_tensors(cfg)
    extra = sorted(k for k in shapes if k not in want and not _IGNORED.fullmatch(k))
    if extra:
        hint = " (q/k/v and gate/up must be separate tensors)" if any(
            "qkv_proj" in k or "gate_up_proj" in k for k in extra) else ""
        raise ConfigError(f"{extra[0]}: unexpected tensor in the checkpoint{hint}"
                          + (f" (+{len(extra) - 1} more)" if len(extra) > 1 else ""))
    plan = []
    for name, shape in want.items():
        if name not in shapes:
            raise ConfigError(f"{name}: missing from the checkpoint")
        if tuple(shapes[name]) != shape:
            raise ConfigError(f"{name}: shape {tuple(shapes[name])}, the config says {shape}")
        plan.append((name, cmf_name(name), shape))
    return plan


def vector_dtype(x: np.ndarray) -> str:
    """docs/cmf-format.md §8 stores 1-D tensors f16; a vector f16 cannot hold exactly (an f32
    checkpoint, or values outside f16's normal range) stays f32, so no scale is lost.
    Every bf16 value in [2^-14, 65504] is an f16 value: bf16 checkpoints get f16."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        back = x.astype(np.float16).astype(np.float32)
    nz = np.abs(x[x != 0])
    if nz.size and nz.min() < 2.0 ** -14:
        return "f32"
    return "f16" if np.array_equal(back, x) else "f32"


# ------------------------------------------------------------------ tokenizer bundle

def _read_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None


def find_tokenizer_json(hf_dir: str | Path) -> bytes | None:
    """``tokenizer.json`` bytes, verbatim (CMF vocab section), or None."""
    p = Path(hf_dir) / "tokenizer.json"
    return p.read_bytes() if p.exists() else None


def find_chat_template(hf_dir: str | Path) -> str | None:
    """``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` (a string,
    or a list of ``{name, template}`` of which "default" or the first is taken)."""
    d = Path(hf_dir)
    if (d / "chat_template.jinja").exists():
        return (d / "chat_template.jinja").read_text(encoding="utf-8")
    if (d / "chat_template.json").exists():
        t = (_read_json(d / "chat_template.json") or {}).get("chat_template")
        if isinstance(t, str):
            return t
    t = (_read_json(d / "tokenizer_config.json") or {}).get("chat_template")
    if isinstance(t, list):
        named = {e.get("name"): e.get("template") for e in t if isinstance(e, dict)}
        t = named.get("default", next(iter(named.values()), None))
    return t if isinstance(t, str) else None


def token_id(tokenizer_json: Mapping | None, content: Any) -> int | None:
    """Id of a token string in a parsed ``tokenizer.json`` (added tokens, then the vocab)."""
    if isinstance(content, Mapping):
        content = content.get("content")
    if not isinstance(content, str) or not tokenizer_json:
        return None
    for t in tokenizer_json.get("added_tokens") or []:
        if t.get("content") == content:
            return int(t["id"])
    vocab = (tokenizer_json.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and content in vocab:
        return int(vocab[content])
    if isinstance(vocab, list):
        for i, entry in enumerate(vocab):
            if entry and entry[0] == content:
                return i
    return None


def _ids(v: Any) -> list[int]:
    if v is None:
        return []
    vals = v if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in vals if isinstance(x, int) and not isinstance(x, bool) and x >= 0]


def _token_files(d: Path, config: Mapping | None):
    """config.json (unless given), generation_config.json, tokenizer_config.json and the
    parsed tokenizer.json of a checkpoint folder ({} / None where absent)."""
    config = config if config is not None else (_read_json(d / "config.json") or {})
    gen = _read_json(d / "generation_config.json") or {}
    tcfg = _read_json(d / "tokenizer_config.json") or {}
    tok = find_tokenizer_json(d)
    return config, gen, tcfg, json.loads(tok) if tok else None


def eos_token_ids(hf_dir: str | Path, config: Mapping | None = None,
                  template: str | None = None) -> list[int]:
    """Every id that ends generation: generation_config's eos (else config.json's), the
    tokenizer's eos token, and the chat end token the template uses. Ordered, unique."""
    d = Path(hf_dir)
    config, gen, tcfg, tok = _token_files(d, config)
    ids = _ids(gen.get("eos_token_id")) or _ids(config.get("eos_token_id"))
    extra = [token_id(tok, tcfg.get("eos_token"))]
    if template:
        extra += [token_id(tok, t) for t in CHAT_END_TOKENS if t in template]
    for i in extra:
        if i is not None:
            ids.append(i)
    return list(dict.fromkeys(ids))


# generation_config.json's sampling fields a request that leaves them out samples with
# (`do_sample` is not read: the fields are taken as the model's advice, as vLLM does).
_GENERATION_DEFAULT_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def generation_defaults(generation_config: Mapping) -> dict:
    """The sampling fields of a parsed generation_config.json that are numbers."""
    return {k: v for k in _GENERATION_DEFAULT_FIELDS
            if isinstance(v := generation_config.get(k), (int, float))
            and not isinstance(v, bool)}


def tokenizer_bundle(hf_dir: str | Path, config: Mapping | None = None) -> dict | None:
    """The header's ``tokenizer_config`` (docs/cmf-format.md §4.4), or None if there is none."""
    d = Path(hf_dir)
    config, gen, tcfg, tok = _token_files(d, config)
    template = find_chat_template(d)
    out: dict[str, Any] = {}
    if template is not None:
        out["chat_template"] = template
    out["eos_token_ids"] = eos_token_ids(d, config, template)
    bos_ids = _ids(gen.get("bos_token_id")) or _ids(config.get("bos_token_id"))
    bos = bos_ids[0] if bos_ids else token_id(tok, tcfg.get("bos_token"))
    pad_ids = _ids(gen.get("pad_token_id")) or _ids(config.get("pad_token_id"))
    pad = pad_ids[0] if pad_ids else token_id(tok, tcfg.get("pad_token"))
    if bos is not None:
        out["bos_token_id"] = bos
    if pad is not None:
        out["pad_token_id"] = pad
    defaults = generation_defaults(gen)
    if defaults:
        out["generation_defaults"] = defaults
    if template is None and not out["eos_token_ids"] and len(out) == 1:
        return None
    return out


# ------------------------------------------------------------------ convert

def read_hf_config(hf_dir: str | Path) -> dict:
    p = Path(hf_dir) / "config.json"
    cfg = _read_json(p)
    if cfg is None:
        raise ConfigError(f"{p}: missing (not a Hugging Face model directory)")
    return cfg


def plan_checkpoint(hf_dir: str | Path) -> tuple[dict, dict, list, dict[str, SafetensorsShard]]:
    """Read and check everything without writing: ``(hf_config, arch, plan, shards)``."""
    hf = read_hf_config(hf_dir)
    arch = arch_from_hf_config(hf)
    cfg = DoryConfig.from_arch(arch)
    shards = open_checkpoint(hf_dir)
    plan = plan_tensors(cfg, {k: s.shape(k) for k, s in shards.items()})
    return hf, arch, plan, shards


def _loader(shard: SafetensorsShard, name: str) -> Callable[[], np.ndarray]:
    return lambda: shard.load(name)


def convert(hf_dir: str | Path, out_path: str | Path, quant: str = "q8_row",
            progress: bool = True, *, vector_dtypes: str | None = None) -> None:
    """Convert a Hugging Face Dory directory into one CMF v2 file.

    Matrices stream one at a time from the safetensors shards into ``cortiq.cmf.write``
    (bounded memory); 1-D scale vectors are read up front (small) to pick their dtype
    (``vector_dtype``; ``vector_dtypes="f32"``/``"f16"`` forces one). Values are the raw
    HF values: the loader applies the load-time transforms (module docstring).
    """
    try:
        from .. import cmf
        write = cmf.write
    except (ImportError, AttributeError):
        raise ImportError("cortiq.cmf.write is not available in this build") from None
    hf_dir = Path(hf_dir)
    hf, arch, plan, shards = plan_checkpoint(hf_dir)
    dtypes: dict[str, str] = {}
    for hf_n, cmf_n, shape in plan:
        if len(shape) == 1:
            if vector_dtypes is not None:
                dtypes[cmf_n] = vector_dtypes
            elif quant != "f32" and vector_dtype(shards[hf_n].load(hf_n)) == "f32":
                dtypes[cmf_n] = "f32"

    def stream() -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
        for hf_n, cmf_n, _ in plan:
            yield cmf_n, _loader(shards[hf_n], hf_n)

    provenance = {
        "converter": CONVERTER,
        "source": hf_dir.name,
        "hf_config": hf,
        "stored_raw": sorted(STORED_RAW),
        "note": "scale vectors are raw HF values; the loader applies the load-time transforms",
    }
    try:
        write(out_path, stream(), arch=arch, quant=quant,
              tokenizer_json=find_tokenizer_json(hf_dir),
              tokenizer_config=tokenizer_bundle(hf_dir, hf), provenance=provenance,
              dtypes=dtypes or None, progress=progress)
    finally:
        for s in set(shards.values()):
            s.close()
