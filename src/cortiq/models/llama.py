"""The Llama family: Llama 2/3, Mistral, Qwen2/2.5 and Qwen3 on the host.

One decoder-only pre-norm transformer covers all of them; what differs is read from
the file, not from the name:

    h = embed[ids]
    per layer:
        a = rmsnorm(h) * w_in
        q, k, v = a Wq (+ bq), a Wk (+ bk), a Wv (+ bv)     (biases: Qwen2)
        q, k = rmsnorm_head(q) * w_q, rmsnorm_head(k) * w_k  (q/k norms: Qwen3)
        q, k = rope(q), rope(k)                              (halves rotated, HF layout)
        o = softmax(q.k / sqrt(hd)) v over the window        (GQA; window: Mistral)
        h = h + o Wo (+ bo)
        m = rmsnorm(h) * w_post
        h = h + (silu(m Wg) * (m Wu)) Wd
    logits = (rmsnorm(h) * w_final) W_head                   (W_head = embed when tied)

The rotary frequencies are HF's default ``1 / theta^(2i/hd)``, divided per frequency
by ``arch.rope_freq_factors`` when present (the converter writes Llama-3's and linear
scaling's divisors there), or replaced by YaRN's (``arch.yarn``, whose
``attention_factor`` scales cos and sin).

Which tensors exist decides the operators (docs/cmf-format.md §4.1): ``self_attn.{q,k,v,o}_proj.bias``,
``mlp.{gate,up,down}_proj.bias``, ``self_attn.{q,k}_norm.weight``; a missing
``lm_head.weight`` means the head is the embedding.

Model protocol (``cortiq.session``): ``new_state()``, ``forward(state, ids, want, prompt)``,
``rollback``/``can_rollback`` (a sliding layer that dropped the keys a position reads
cannot roll back in place; the Session then re-reads), ``vocab``, ``arch``.
Prompts run in chunks of ``CHUNK`` rows through the matrix-matrix kernels, marked as
prompt rows (``matmat(prompt=True)``: precision "auto" multiplies them with int8
activations for q8 weights too), a chunk of one row included; generated tokens run
one row through fused multi-matrix matvecs. The caller says which a feed is
(``prompt``, ``cortiq.session``); the layer functions take it explicitly, False unless
told, so rows of several sequences' decode steps stacked through them keep decode's
arithmetic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import _kernels as K
from ..errors import ConfigError, CortiqError, FormatError
from ..tensor import QGroup, QTensor, batch_products
from . import builtin_spec
from .batch_rows import head_decode, head_rows, prompt_flags
from .batch_rows import per_sequence
from .base import Capabilities, ModelBase
from .kv_cache import KvSlot
from .rope import RopeTable, inv_freq, yarn_attention_factor, yarn_inv_freq

#: arch_name values this module runs: the Llama family's names in the registry
ARCH_NAMES = builtin_spec("llama").names
#: rows of a prompt run through the stack together
CHUNK = 64


# ---- config -------------------------------------------------------------------------
@dataclass
class LlamaConfig:
    arch_name: str
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    n_kv: int
    head_dim: int
    vocab: int
    eps: float
    rope_theta: float
    max_pos: int
    windows: list          # per layer: 0 (full) or the sliding window in tokens
    rope_freq_factors: list | None = None
    yarn: dict | None = None

    @classmethod
    def from_arch(cls, arch) -> LlamaConfig:
        def need(k):
            v = arch.get(k)
            if v is None:
                raise ConfigError(f"arch.{k}: missing (required for {arch.get('arch_name')})")
            return v
        n = int(need("num_layers"))
        types = arch.get("layer_types") or ["FullAttention"] * n
        if len(types) != n:
            raise ConfigError(f"arch.layer_types: {len(types)} entries for {n} layers")
        window = arch.get("sliding_window")
        windows = []
        for i, t in enumerate(types):
            if t == "FullAttention":
                windows.append(0)
            elif t == "SlidingAttention":
                if not window or int(window) < 1:
                    raise ConfigError(f"arch.sliding_window: layer {i} slides but the window "
                                      f"is {window!r}")
                windows.append(int(window))
            else:
                raise ConfigError(f"arch.layer_types[{i}]: {t!r}: the Llama family has only "
                                  "FullAttention and SlidingAttention layers")
        if arch.get("norm_style", "qwen") != "qwen":
            raise ConfigError(f"arch.norm_style: {arch.get('norm_style')!r}; the Llama family "
                              "scales by w (norm_style 'qwen')")
        if arch.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"arch.hidden_act: {arch.get('hidden_act')!r}; cortiq runs the "
                              "Llama family with SwiGLU (silu)")
        prf = arch.get("partial_rotary_factor", 1.0)
        if prf not in (None, 1, 1.0):
            raise ConfigError(f"arch.partial_rotary_factor: {prf!r}; cortiq rotates whole "
                              "heads in the Llama family (1.0)")
        hidden, nh = int(need("hidden_size")), int(need("num_attention_heads"))
        nk = int(arch.get("num_kv_heads") or nh)
        hd = int(arch.get("head_dim") or hidden // nh)
        if nk < 1 or nh % nk:
            raise ConfigError(f"arch.num_kv_heads: {nh} heads do not group over {nk} kv heads")
        if hd % 2:
            raise ConfigError(f"arch.head_dim: {hd} must be even for RoPE")
        ff = arch.get("rope_freq_factors")
        if ff is not None:
            if len(ff) != hd // 2:
                raise ConfigError(f"arch.rope_freq_factors: {len(ff)} factors, head_dim {hd} "
                                  f"needs {hd // 2}")
            if not all(isinstance(f, (int, float)) and math.isfinite(f) and f > 0 for f in ff):
                raise ConfigError("arch.rope_freq_factors: every factor must be a positive "
                                  "finite number")
        yarn = arch.get("yarn")
        if yarn is not None and (not isinstance(yarn, dict) or "factor" not in yarn
                                 or "original_max_position_embeddings" not in yarn):
            raise ConfigError("arch.yarn: needs factor and original_max_position_embeddings")
        return cls(arch_name=str(arch.get("arch_name")), hidden=hidden,
                   ffn=int(need("intermediate_size")), n_layers=n, n_heads=nh, n_kv=nk,
                   head_dim=hd, vocab=int(need("vocab_size")),
                   eps=float(arch.get("rms_norm_eps") or 1e-6),
                   rope_theta=float(arch.get("rope_theta") or 10000.0),
                   max_pos=int(arch.get("max_position_embeddings") or 0), windows=windows,
                   rope_freq_factors=None if ff is None else [float(x) for x in ff],
                   yarn=yarn)

    def inv_freq(self) -> tuple[np.ndarray, float]:
        """(inverse frequencies, cos/sin scale) of this model's rotary profile."""
        if self.yarn is not None:
            y = self.yarn
            inv = yarn_inv_freq(self.head_dim, self.rope_theta, float(y["factor"]),
                                int(y["original_max_position_embeddings"]),
                                float(y.get("beta_fast") or 32.0),
                                float(y.get("beta_slow") or 1.0))
            af = y.get("attention_factor")
            if af is None:
                af = yarn_attention_factor(float(y["factor"]))
            return inv, float(af)
        inv = inv_freq(self.head_dim, self.rope_theta)
        if self.rope_freq_factors is not None:
            inv = (inv / np.asarray(self.rope_freq_factors, np.float32)).astype(np.float32)
        return inv, 1.0


# ---- weights ------------------------------------------------------------------------
@dataclass
class Layer:
    attn_norm: np.ndarray
    q: QTensor
    k: QTensor
    v: QTensor
    o: QTensor
    bq: np.ndarray | None
    bk: np.ndarray | None
    bv: np.ndarray | None
    bo: np.ndarray | None
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    mlp_norm: np.ndarray
    gate: QTensor
    up: QTensor
    down: QTensor
    bg: np.ndarray | None
    bu: np.ndarray | None
    bd: np.ndarray | None
    window: int

    def __post_init__(self):
        self.qkv = QGroup([self.q, self.k, self.v])       # one pass over x per token
        self.gate_up = QGroup([self.gate, self.up])


# ---- per-sequence state -------------------------------------------------------------
class LlamaState:
    """One sequence: a KV cache per layer and the next position."""

    def __init__(self, model: LlamaModel):
        self.pos = 0
        self.caches = [KvSlot(model.cfg.n_kv, model.cfg.head_dim) for _ in model.layers]


# ---- the model ----------------------------------------------------------------------
class LlamaModel(ModelBase):
    """Weights and forward of a Llama-family file; one instance serves many sequences."""

    supports_rollback = True
    takes_prompt = True         # forward / forward_batch take the prompt flag
    #: the batch scheduler feeds a prompt in pieces of this many rows (forward's chunks)
    batch_unit = CHUNK

    def __init__(self, cmf_file):
        cf = self.file = cmf_file
        name = cf.arch.get("arch_name")
        if name not in ARCH_NAMES:
            raise ConfigError(f"{cf.path}: arch_name {name!r} is not one of "
                              f"{', '.join(ARCH_NAMES)}")
        cfg = self.cfg = LlamaConfig.from_arch(cf.arch)
        self.arch = name
        self.vocab = cfg.vocab
        self.max_seq_len = cfg.max_pos or None
        self.capabilities = Capabilities(rollback=True, batch_unit=CHUNK,
                                         max_seq_len=self.max_seq_len)
        H, nh, nk, hd, F = cfg.hidden, cfg.n_heads, cfg.n_kv, cfg.head_dim, cfg.ffn

        def vec(n, size, required=True):
            if n not in cf.tensors:
                if required:
                    raise FormatError(f"{cf.path}: tensor {n!r} missing")
                return None
            v = np.ascontiguousarray(cf.tensor(n), np.float32).ravel()
            if v.size != size:
                raise FormatError(f"{cf.path}: {n}: {v.size} values, the config needs {size}")
            return v

        def mat(n, rows, cols):
            if n not in cf.tensors:
                raise FormatError(f"{cf.path}: tensor {n!r} missing")
            t = QTensor.from_cmf(cf, n)
            if (t.rows, t.cols) != (rows, cols):
                raise FormatError(f"{cf.path}: {n}: shape [{t.rows}, {t.cols}], the config "
                                  f"needs [{rows}, {cols}]")
            return t

        self.layers: list[Layer] = []
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}"
            a, m = f"{p}.self_attn", f"{p}.mlp"
            self.layers.append(Layer(
                attn_norm=vec(f"{p}.input_layernorm.weight", H),
                q=mat(f"{a}.q_proj.weight", nh * hd, H), k=mat(f"{a}.k_proj.weight", nk * hd, H),
                v=mat(f"{a}.v_proj.weight", nk * hd, H), o=mat(f"{a}.o_proj.weight", H, nh * hd),
                bq=vec(f"{a}.q_proj.bias", nh * hd, False), bk=vec(f"{a}.k_proj.bias", nk * hd, False),
                bv=vec(f"{a}.v_proj.bias", nk * hd, False), bo=vec(f"{a}.o_proj.bias", H, False),
                q_norm=vec(f"{a}.q_norm.weight", hd, False), k_norm=vec(f"{a}.k_norm.weight", hd, False),
                mlp_norm=vec(f"{p}.post_attention_layernorm.weight", H),
                gate=mat(f"{m}.gate_proj.weight", F, H), up=mat(f"{m}.up_proj.weight", F, H),
                down=mat(f"{m}.down_proj.weight", H, F),
                bg=vec(f"{m}.gate_proj.bias", F, False), bu=vec(f"{m}.up_proj.bias", F, False),
                bd=vec(f"{m}.down_proj.bias", H, False), window=cfg.windows[i]))
        self.embed = mat("model.embed_tokens.weight", cfg.vocab, H)
        self.norm = vec("model.norm.weight", H)
        self.head = (mat("lm_head.weight", cfg.vocab, H) if "lm_head.weight" in cf.tensors
                     else self.embed)
        inv, scale = cfg.inv_freq()
        self.rope = RopeTable(inv, scale)
        self.attn_scale = float(hd ** -0.5)
        self._ones = np.ones(F, np.float32)          # silu_mul's unit column scales

    # -- sequences -------------------------------------------------------------------
    def new_state(self) -> LlamaState:
        return LlamaState(self)

    def can_rollback(self, st: LlamaState, n: int) -> bool:
        """True when every sliding layer still holds the keys a token at n reads."""
        for L, c in zip(self.layers, st.caches):
            if L.window and c.first > max(0, n + 1 - L.window):
                return False
        return True

    def rollback(self, st: LlamaState, n: int) -> None:
        if not self.can_rollback(st, n):
            raise CortiqError(f"{self.arch}: cannot roll back to {n}: a sliding layer has "
                              "already dropped keys that position reads")
        for c in st.caches:
            c.rollback(n)
        st.pos = min(st.pos, n)

    def kv_bytes(self, st: LlamaState) -> int:
        return sum(2 * c.n * c.k.shape[1] * c.k.shape[2] * 4 for c in st.caches)

    def forward(self, st: LlamaState, ids, want: str = "last", prompt: bool | None = None):
        """Run `ids` from position st.pos. want: "none" -> None, "last" -> [vocab],
        "all" -> [len(ids), vocab] (float32). prompt: prompt rows (True) or generated
        tokens (False); None: prompt rows when there are several."""
        if want not in ("none", "last", "all"):
            raise ConfigError(f"want must be 'none', 'last' or 'all', got {want!r}")
        ids = np.asarray(ids, dtype=np.int64).ravel()
        if ids.size == 0:
            return None if want == "none" else np.zeros(
                (0, self.vocab) if want == "all" else 0, np.float32)
        bad = (ids < 0) | (ids >= self.vocab)
        if bad.any():
            raise ValueError(f"token id {int(ids[bad][0])} is outside the vocabulary "
                             f"[0, {self.vocab})")
        prompt = ids.size > 1 if prompt is None else bool(prompt)
        rows = []
        for start in range(0, ids.size, CHUNK):
            chunk = ids[start:start + CHUNK]
            last = start + chunk.size == ids.size
            h = np.stack([self.embed.row(int(i)) for i in chunk]).astype(np.float32)
            self._stack(st, h, prompt)
            if want == "all":
                rows.append(self._logits(h, prompt))
            elif want == "last" and last:
                rows.append(self._logits(h[-1:])[0])
        if want == "none":
            return None
        return rows[-1] if want == "last" else np.concatenate(rows, axis=0)

    def final_hidden(self, st: LlamaState, ids) -> np.ndarray:
        """The final-norm hidden states [len(ids), hidden] of `ids` run from st.pos
        (what the head reads; `cortiq.embeddings` pools them)."""
        ids = np.asarray(ids, dtype=np.int64).ravel()
        rows = []
        for start in range(0, ids.size, CHUNK):
            h = np.stack([self.embed.row(int(i)) for i in ids[start:start + CHUNK]]
                         ).astype(np.float32)
            self._stack(st, h)
            rows.append(K.rmsnorm(h, self.norm, self.cfg.eps))
        return np.concatenate(rows, axis=0)

    # -- the stack -------------------------------------------------------------------
    def _stack(self, st: LlamaState, h: np.ndarray, prompt: bool = False) -> None:
        t = h.shape[0]
        cfg = self.cfg
        cos, sin = self.rope(st.pos, t)
        for L, cache in zip(self.layers, st.caches):
            a = K.rmsnorm(h, L.attn_norm, cfg.eps)
            h += self._attention(L, cache, a, st.pos, cos, sin, prompt)
            m = K.rmsnorm(h, L.mlp_norm, cfg.eps)
            h += self._mlp(L, m, prompt)
        st.pos += t
        for L, cache in zip(self.layers, st.caches):
            if L.window:
                cache.trim(L.window)

    def _attention(self, L: Layer, cache: KvSlot, x, pos0, cos, sin,
                   prompt: bool = False) -> np.ndarray:
        t = x.shape[0]
        nh, nk, hd = self.cfg.n_heads, self.cfg.n_kv, self.cfg.head_dim
        if t == 1 and not prompt:
            q, k, v = L.qkv.matvec(x[0])
        else:
            q, k, v = (L.q.matmat(x, prompt=prompt), L.k.matmat(x, prompt=prompt),
                       L.v.matmat(x, prompt=prompt))
        for y, b in ((q, L.bq), (k, L.bk), (v, L.bv)):
            if b is not None:
                y += b
        q = q.reshape(t, nh, hd)
        k = k.reshape(t, nk, hd)
        if L.q_norm is not None:
            K.rmsnorm(q, L.q_norm, self.cfg.eps, out=q)
        if L.k_norm is not None:
            K.rmsnorm(k, L.k_norm, self.cfg.eps, out=k)
        K.rope_halfsplit(q, cos, sin)
        K.rope_halfsplit(k, cos, sin)
        cache.put(k, v.reshape(t, nk, hd), overwrite=False)
        y = K.attn_gqa_window(q, cache.k[:cache.n], cache.v[:cache.n], pos0, L.window,
                              cache.first, self.attn_scale)
        y = y.reshape(t, nh * hd)
        out = L.o.matvec(y[0])[None] if t == 1 and not prompt else L.o.matmat(y, prompt=prompt)
        if L.bo is not None:
            out += L.bo
        return out

    def _mlp(self, L: Layer, x, prompt: bool = False) -> np.ndarray:
        t = x.shape[0]
        if t == 1 and not prompt:
            g, u = L.gate_up.matvec(x[0])
            g, u = g[None], u[None]
        else:
            g, u = L.gate.matmat(x, prompt=prompt), L.up.matmat(x, prompt=prompt)
        if L.bg is not None:
            g += L.bg
        if L.bu is not None:
            u += L.bu
        K.silu_mul(g, u, self._ones, self._ones)
        out = L.down.matvec(g[0])[None] if t == 1 and not prompt else L.down.matmat(g, prompt=prompt)
        if L.bd is not None:
            out += L.bd
        return out

    def _logits(self, h: np.ndarray, prompt: bool = False) -> np.ndarray:
        x = K.rmsnorm(h, self.norm, self.cfg.eps)
        return (self.head.matvec(x[0])[None] if x.shape[0] == 1 and not prompt
                else self.head.matmat(x, prompt=prompt))

    # -- several sequences in one pass ------------------------------------------------
    def forward_batch(self, states, ids_list, wants, prompts=None):
        """`forward` for several sequences at once: every weight matrix is read once per
        step for the rows of all of them (matmat), attention runs per sequence. Each
        sequence's ids are cut into CHUNK pieces exactly as `forward` cuts them, so the
        caches end up the same; `prompts` (one flag per sequence, as `forward`'s
        `prompt`) picks each row's products. Returns one result per sequence, shaped
        as `forward`'s."""
        ids_list = [_check_ids(np.asarray(ids, np.int64).ravel(), self.vocab)
                    for ids in ids_list]
        prompts = prompt_flags(prompts, ids_list)
        outs = [[] for _ in states]
        at = [0] * len(states)
        while True:
            segs = [(i, ids_list[i][at[i]:at[i] + CHUNK]) for i in range(len(states))
                    if at[i] < ids_list[i].size]
            if not segs:
                break
            h = np.stack([self.embed.row(int(t)) for _, c in segs for t in c]).astype(np.float32)
            self._stack_batch([states[i] for i, _ in segs], [c.size for _, c in segs],
                              [prompts[i] for i, _ in segs], h)
            picks, r0 = [], 0
            for i, c in segs:
                at[i] += c.size
                if wants[i] == "all":
                    picks.append((i, r0, c.size, prompts[i]))
                elif wants[i] == "last" and at[i] == ids_list[i].size:
                    picks.append((i, r0 + c.size - 1, 1, False))
                r0 += c.size
            if picks:
                x = K.rmsnorm(h[head_rows(picks)], self.norm, self.cfg.eps)
                lg = batch_products([self.head], x, head_decode(picks))[0]
                j = 0
                for i, _, n, _ in picks:
                    outs[i].append(lg[j:j + n])
                    j += n
        return per_sequence(outs, wants, self.vocab)

    def _stack_batch(self, sts, sizes, prompts, h: np.ndarray) -> None:
        """`_stack` over the rows of several sequences (sizes[j] rows of sts[j], in order;
        prompts[j]: whether they are prompt rows)."""
        if len(sts) == 1:
            return self._stack(sts[0], h, prompts[0])
        cfg = self.cfg
        nh, nk, hd = cfg.n_heads, cfg.n_kv, cfg.head_dim
        T = h.shape[0]
        starts = np.cumsum([0] + sizes[:-1]).tolist()
        decode = np.repeat(~np.asarray(prompts, bool), sizes)   # generated tokens: matvec rows
        ropes = [self.rope(st.pos, t) for st, t in zip(sts, sizes)]
        y = np.empty((T, nh * hd), np.float32)
        for li, L in enumerate(self.layers):
            a = K.rmsnorm(h, L.attn_norm, cfg.eps)
            q, k, v = batch_products((L.q, L.k, L.v), a, decode)
            for z, b in ((q, L.bq), (k, L.bk), (v, L.bv)):
                if b is not None:
                    z += b
            for st, r0, t, (cos, sin) in zip(sts, starts, sizes, ropes):
                qs = q[r0:r0 + t].reshape(t, nh, hd)
                ks = k[r0:r0 + t].reshape(t, nk, hd)
                if L.q_norm is not None:
                    K.rmsnorm(qs, L.q_norm, cfg.eps, out=qs)
                if L.k_norm is not None:
                    K.rmsnorm(ks, L.k_norm, cfg.eps, out=ks)
                K.rope_halfsplit(qs, cos, sin)
                K.rope_halfsplit(ks, cos, sin)
                cache = st.caches[li]
                cache.put(ks, v[r0:r0 + t].reshape(t, nk, hd), overwrite=False)
                y[r0:r0 + t] = K.attn_gqa_window(
                    qs, cache.k[:cache.n], cache.v[:cache.n], st.pos, L.window, cache.first,
                    self.attn_scale).reshape(t, nh * hd)
            out = batch_products((L.o,), y, decode)[0]
            if L.bo is not None:
                out += L.bo
            h += out
            m = K.rmsnorm(h, L.mlp_norm, cfg.eps)
            g, u = batch_products((L.gate, L.up), m, decode)
            if L.bg is not None:
                g += L.bg
            if L.bu is not None:
                u += L.bu
            K.silu_mul(g, u, self._ones, self._ones)
            out = batch_products((L.down,), g, decode)[0]
            if L.bd is not None:
                out += L.bd
            h += out
        for st, t in zip(sts, sizes):
            st.pos += t
            for L, cache in zip(self.layers, st.caches):
                if L.window:
                    cache.trim(L.window)


def _check_ids(ids: np.ndarray, vocab: int) -> np.ndarray:
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        raise ValueError(f"token id {int(ids[bad][0])} is outside the vocabulary [0, {vocab})")
    return ids
