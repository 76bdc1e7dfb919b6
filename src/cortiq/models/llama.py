"""The Llama family: Llama 2/3, Mistral, Qwen2/2.5 and Qwen3 on the host.

One decoder-only pre-norm transformer covers all of them; what differs is read from
the file, not from the name:

    h = embed[ids]
    per layer:
        a = rmsnorm(h) * w_in
        q, k, v = a Wq (+ bq), a Wk (+ bk), a Wv (+ bv)     (biases: Qwen2)
        q, k = rmsnorm_head(q) * w_q, rmsnorm_head(k) * w_k  (q/k norms: Qwen3)
        q, k = rope(q), rope(k)                              (halves rotated, HF layout;
                                                              pairs with rope_interleaved)
        o = softmax(q.k / sqrt(hd)) v over the window        (GQA; window: Mistral)
        h = h + o Wo (+ bo)
        m = rmsnorm(h) * w_post
        h = h + (silu(m Wg) * (m Wu)) Wd
    logits = (rmsnorm(h) * w_final) W_head                   (W_head = embed when tied)

The rotary frequencies are HF's default ``1 / theta^(2i/hd)``, divided per frequency
by ``arch.rope_freq_factors`` when present (the converter writes Llama-3's and linear
scaling's divisors there), or replaced by YaRN's (``arch.yarn``, whose
``attention_factor`` scales cos and sin). ``arch.rope_interleaved`` (a Llama/Mistral
GGUF file run as it is, `cortiq.gguf`) rotates adjacent pairs (2i, 2i+1) of each head
instead of its halves (i, i + hd/2): llama.cpp stores those files' q/k rows in that
order, and q.k is the same under the same permutation of both.

Which tensors exist decides the operators (docs/cmf-format.md §4.1): ``self_attn.{q,k,v,o}_proj.bias``,
``mlp.{gate,up,down}_proj.bias``, ``self_attn.{q,k}_norm.weight``; a missing
``lm_head.weight`` means the head is the embedding.

The one forward is `LlamaModel.forward_batch` (``cortiq.models.base``): the rows of
several sequences stacked through every layer together, one sequence being a batch of
one. Each sequence's ids run in pieces of ``CHUNK`` rows, and every product picks its
arithmetic per row (``cortiq.kernels.tensor.batch_products``): prompt rows through
``matmat(prompt=True)`` (precision "auto" multiplies them with int8 activations for q8
weights too), a piece of one row included; generated tokens through the multi-input
matvec, bit-identical to a matvec for one row. So a row's bits depend on its kind,
never on how the feed was cut or batched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..kernels import _kernels as K
from ..errors import ConfigError, CortiqError, FormatError
from ..kernels.tensor import QTensor, batch_products
from . import builtin_spec
from .base import Capabilities, ModelBase, check_feed, is_prompt
from .batch_rows import head_decode, head_rows, per_sequence, prompt_flags
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
    rope_interleaved: bool = False     # q/k rows in llama.cpp's pair order (GGUF)

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
                   yarn=yarn, rope_interleaved=bool(arch.get("rope_interleaved", False)))

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
class Products:
    """Matrices that read one input, each with its bias where the file has one (a
    layer's q/k/v, o, gate/up, down)."""

    __slots__ = ("biased", "biases", "handles", "mats")

    def __init__(self, mats: list[QTensor], biases: list[np.ndarray | None]):
        self.mats, self.biases = tuple(mats), tuple(biases)
        # the kernel handles, taken once: a decode step multiplies by them 65 times a
        # token in a 16-layer model (a tensor's precision lives in its handle, so a
        # later set_precision still reaches these)
        self.handles = [m.qmat for m in mats]
        self.biased = any(b is not None for b in biases)

    def __call__(self, X: np.ndarray, decode) -> list[np.ndarray]:
        """X @ M.T (+ b) per matrix; `decode` says per row whether it is a generated
        token (`cortiq.kernels.tensor.batch_products`)."""
        # generated tokens only: batch_products' own first case, without its dispatch
        ys = (K.matvec_batch(self.handles, X) if decode is True
              else batch_products(self.mats, X, decode))
        if self.biased:
            for y, b in zip(ys, self.biases):
                if b is not None:
                    y += b
        return ys


@dataclass
class Layer:
    attn_norm: np.ndarray
    qkv: Products
    q_norm: np.ndarray | None     # per-head q/k norms (Qwen3)
    k_norm: np.ndarray | None
    o: Products
    mlp_norm: np.ndarray
    gate_up: Products
    down: Products
    window: int                   # 0 (full) or the sliding window in tokens


# ---- per-sequence state -------------------------------------------------------------
class LlamaState:
    """One sequence: a KV cache per layer and the next position."""

    def __init__(self, model: LlamaModel):
        self.pos = 0
        self.caches = [KvSlot(model.cfg.n_kv, model.cfg.head_dim) for _ in model.layers]


# ---- the model ----------------------------------------------------------------------
class LlamaModel(ModelBase):
    """Weights and forward of a Llama-family file; one instance serves many sequences."""

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
        # the scheduler feeds a prompt in the forward's own pieces
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

        def products(prefix, outs, cols):
            return Products([mat(f"{prefix}.{n}.weight", rows, cols) for n, rows in outs],
                            [vec(f"{prefix}.{n}.bias", rows, False) for n, rows in outs])

        self.layers: list[Layer] = []
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}"
            a, m = f"{p}.self_attn", f"{p}.mlp"
            self.layers.append(Layer(
                attn_norm=vec(f"{p}.input_layernorm.weight", H),
                qkv=products(a, [("q_proj", nh * hd), ("k_proj", nk * hd), ("v_proj", nk * hd)], H),
                q_norm=vec(f"{a}.q_norm.weight", hd, False), k_norm=vec(f"{a}.k_norm.weight", hd, False),
                o=products(a, [("o_proj", H)], nh * hd),
                mlp_norm=vec(f"{p}.post_attention_layernorm.weight", H),
                gate_up=products(m, [("gate_proj", F), ("up_proj", F)], H),
                down=products(m, [("down_proj", H)], F), window=cfg.windows[i]))
        self.embed = mat("model.embed_tokens.weight", cfg.vocab, H)
        self.norm = vec("model.norm.weight", H)
        self.head = (mat("lm_head.weight", cfg.vocab, H) if "lm_head.weight" in cf.tensors
                     else self.embed)
        inv, scale = cfg.inv_freq()
        self.rope = RopeTable(inv, scale)
        self._rotate = (self._rope_pairs if cfg.rope_interleaved
                        else K.rope_halfsplit)          # how q/k rows hold each head
        self.attn_scale = float(hd ** -0.5)
        self._ones = np.ones(F, np.float32)          # silu_mul's unit column scales
        # per layer, what the fused decode rows take (`_decode_row`)
        self._fused = [([m.qmat for m in L.qkv.mats], L.o.mats[0].qmat,
                        [*L.qkv.biases, *L.o.biases], [m.qmat for m in L.gate_up.mats],
                        L.down.mats[0].qmat, [*L.gate_up.biases, *L.down.biases])
                       for L in self.layers]
        self._row_scratch = max(K.llama_attn_scratch(H, nh * hd), K.llama_mlp_scratch(H, F))

    def _rope_pairs(self, x, cos, sin):
        """Rope on adjacent pairs of whole heads (llama.cpp's q/k row order)."""
        return K.rope_interleaved_tail(x, cos, sin, self.cfg.head_dim)

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

    def matrices(self) -> list[QTensor]:
        """Every matrix the forward multiplies by: each layer's seven products and the
        head (the embedding only when the head is tied to it; otherwise it is looked
        up, never multiplied)."""
        return [m for L in self.layers for group in (L.qkv, L.o, L.gate_up, L.down)
                for m in group.mats] + [self.head]

    # -- the forward -----------------------------------------------------------------
    def forward_batch(self, states, ids_list, wants, prompts=None) -> list:
        """Run each sequence's ids from its state's position, every sequence's rows
        through the layers together (one sequence is a batch of one). wants[i]: "none"
        -> None, "last" -> [vocab], "all" -> [len(ids), vocab] (float32); prompts[i]:
        prompt rows (True) or generated tokens (False), None: prompt rows when there
        are several. Each sequence's ids run in pieces of CHUNK rows."""
        if not len(states) == len(ids_list) == len(wants):
            raise ValueError(f"forward_batch: {len(states)} states, {len(ids_list)} id lists "
                             f"and {len(wants)} wants; one of each per sequence")
        feeds = [check_feed(ids, want, self.vocab) for ids, want in zip(ids_list, wants)]
        kinds = prompt_flags(prompts, feeds)
        outs: list[list[np.ndarray]] = [[] for _ in feeds]
        done = [0] * len(feeds)
        while True:
            # the next piece of every sequence not yet through
            step = [i for i, a in enumerate(feeds) if done[i] < a.size]
            if not step:
                break
            pieces = [feeds[i][done[i]:done[i] + CHUNK] for i in step]
            if len(pieces) == 1 and pieces[0].size == 1 and not kinds[step[0]]:
                h = self._decode_row(states[step[0]], int(pieces[0][0]))
            else:
                h = self._stack([states[i] for i in step], pieces, [kinds[i] for i in step])
            # the rows the head reads: all of a piece ("all", with its kind) or a
            # sequence's last row (a generated token's product)
            picks, r0 = [], 0
            for i, piece in zip(step, pieces):
                done[i] += piece.size
                if wants[i] == "all":
                    picks.append((i, r0, piece.size, kinds[i]))
                elif wants[i] == "last" and done[i] == feeds[i].size:
                    picks.append((i, r0 + piece.size - 1, 1, False))
                r0 += piece.size
            if not picks:
                continue
            _, r, n, _ = picks[0]                 # one sequence's rows: a slice, not a gather
            rows = h[r:r + n] if len(picks) == 1 else h[head_rows(picks)]
            x = K.rmsnorm(rows, self.norm, self.cfg.eps)                      # final norm
            decode = head_decode(picks) if any(p[3] for p in picks) else None
            logits = batch_products((self.head,), x, decode)[0]              # head
            j = 0
            for i, _, n, _ in picks:
                outs[i].append(logits[j:j + n])
                j += n
        return per_sequence(outs, wants, self.vocab)

    def final_hidden(self, st: LlamaState, ids) -> np.ndarray:
        """The final-norm hidden states [len(ids), hidden] of `ids` run from st.pos
        (what the head reads; `cortiq.runtime.embeddings` pools them)."""
        a = check_feed(ids, "all", self.vocab)
        prompt = is_prompt(None, a.size)
        rows = [K.rmsnorm(self._stack([st], [a[s:s + CHUNK]], [prompt]), self.norm, self.cfg.eps)
                for s in range(0, a.size, CHUNK)]
        return (np.concatenate(rows, axis=0) if rows
                else np.zeros((0, self.cfg.hidden), np.float32))

    def _stack(self, sts: list[LlamaState], pieces: list[np.ndarray],
               kinds: list[bool]) -> np.ndarray:
        """The residual stream [rows, hidden] after the last layer for the pieces of
        several sequences stacked in order (pieces[j] runs from sts[j].pos; kinds[j]:
        prompt rows or generated tokens). Appends to the caches and moves each state
        past its piece."""
        cfg = self.cfg
        nh, nk, hd, eps = cfg.n_heads, cfg.n_kv, cfg.head_dim, cfg.eps
        sizes = [p.size for p in pieces]
        # per row: a generated token or a prompt row (one flag when every row is of one kind)
        decode = (not kinds[0] if len(set(kinds)) == 1
                  else np.repeat(~np.asarray(kinds, bool), sizes))
        spans, n = [], 0                      # per sequence: its rows, its rope rows
        for st, t in zip(sts, sizes):
            spans.append((st, n, n + t, *self.rope(st.pos, t)))
            n += t
        att = np.empty((n, nh * hd), np.float32)             # attention's output rows
        att_heads = att.reshape(n, nh, hd)
        h = np.empty((n, cfg.hidden), np.float32)
        for r, token in enumerate(i for p in pieces for i in p.tolist()):
            self.embed.row(token, out=h[r])                   # embed
        for li, L in enumerate(self.layers):
            a = K.rmsnorm(h, L.attn_norm, eps)                # attention norm
            q, k, v = L.qkv(a, decode)                        # q, k, v products (+ biases)
            for st, r0, r1, cos, sin in spans:
                t = r1 - r0
                qs, ks = q[r0:r1].reshape(t, nh, hd), k[r0:r1].reshape(t, nk, hd)
                if L.q_norm is not None:                      # per-head q/k norms
                    K.rmsnorm(qs, L.q_norm, eps, out=qs)
                if L.k_norm is not None:
                    K.rmsnorm(ks, L.k_norm, eps, out=ks)
                self._rotate(qs, cos, sin)                    # rope
                self._rotate(ks, cos, sin)
                cache = st.caches[li]                         # cache append
                cache.put(ks, v[r0:r1].reshape(t, nk, hd), overwrite=False)
                K.attn_gqa_window(qs, cache.k[:cache.n], cache.v[:cache.n], st.pos, L.window,
                                  cache.first, self.attn_scale,
                                  out=att_heads[r0:r1])       # windowed GQA attention
            h += L.o(att, decode)[0]                          # o product (+ bias), residual
            m = K.rmsnorm(h, L.mlp_norm, eps)                 # mlp norm
            g, u = L.gate_up(m, decode)                       # gate, up products (+ biases)
            K.silu_mul(g, u, self._ones, self._ones)          # silu(gate) * up, into g
            h += L.down(g, decode)[0]                         # down product (+ bias), residual
        for st, t in zip(sts, sizes):
            self._advance(st, t)
        return h

    def _decode_row(self, st: LlamaState, token: int) -> np.ndarray:
        """`_stack` for one generated token of one sequence: each sub-layer is one fused
        kernel call (`cortiq.kernels._kernels.llama_attn_row` / `llama_mlp_row`, the
        same kernel calls in the same order, so the same bits) rather than ~10 calls
        with Python between them: on a decode step that Python time is serial, outside
        the weight stream every thread count shares."""
        cfg = self.cfg
        h = np.empty((1, cfg.hidden), np.float32)
        self.embed.row(token, out=h[0])                       # embed
        hv = h[0]
        cos, sin = self.rope(st.pos, 1)
        cos, sin = cos[0], sin[0]
        scratch = np.empty(self._row_scratch, np.float32)
        interleaved, eps, scale, pos = cfg.rope_interleaved, cfg.eps, self.attn_scale, st.pos
        for L, fused, cache in zip(self.layers, self._fused, st.caches):
            qkv, wo, attn_biases, gate_up, wdown, mlp_biases = fused
            row = cache.free_row()
            K.llama_attn_row(qkv, wo, hv, L.attn_norm, attn_biases, L.q_norm, L.k_norm,
                             cos, sin, interleaved, cache.k, cache.v, row, cache.first, pos,
                             L.window, scale, scratch, eps)
            cache.n += 1
            K.llama_mlp_row(gate_up, wdown, hv, L.mlp_norm, mlp_biases, self._ones, scratch,
                            eps)
        self._advance(st, 1)
        return h

    def _advance(self, st: LlamaState, t: int) -> None:
        """Move `st` past `t` positions; sliding layers drop keys no later position
        reads."""
        st.pos += t
        for L, cache in zip(self.layers, st.caches):
            if L.window:
                cache.trim(L.window)
