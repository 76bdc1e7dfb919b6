"""An independent float64 NumPy reference of the Dory forward (NVIDIA Nemotron Labs Dory).

Written from the published semantics (vLLM's ``models/dory.py`` + ``configs/dory.py``,
llama.cpp's ``src/models/dory.cpp`` and its NumPy check in ``tests/test-dory.py``) and the
reference engine (cortiq-engine 0.8.64, ``dory.rs``). It works on a Hugging Face checkpoint
-- a dict of numpy arrays with HF tensor names (``backbone.*``, ``lm_head.*``) plus the HF
``config.json`` dict -- and imports nothing from cortiq, so it can judge cortiq's forward.
``DoryReference.from_cmf`` accepts CMF names and a CMF ``arch`` dict instead (the rename is
re-derived here, not imported from the converter).

Model (every activation float64; ``n(x) = x / sqrt(sum(x^2) + 1e-6)`` over the last axis)::

    h = embed[ids]                                   # no norm of the embedding
    h = input block (n_input sub-layers, once)
    inp = h; state = inp
    repeat loops:                                    # the recurrent block, shared weights
        h = n(state + inp); h = recurrent block(h); state = n(h)
    h = output block(state)                          # no final norm
    logits = (lm_head @ h) * logit_scale / sigma0

    attention ('S' sliding, '*' full): q,k,v,g = W x; rotate q,k (half-split / NeoX, whole
      head, theta by the layer's rope profile); q = n(q_h) * (sqk*sqrt(hd)/sigma0)^2 per head,
      k = n(k_h); softmax(q.k / sqrt(hd)) over keys j <= t (and t - j < W on 'S' layers: the
      current token counts, W keys at most), GQA head h -> kv head h // (nh/nkv);
      y = n(y * sigmoid(g * (s_gate*sqrt(g0)/sigma0)^2)) over the whole nh*hd row; out = O y
    mlp ('-'): a = (Wg x)*suv_gate*sqrt(H), b = (Wu x)*suv_up*sqrt(H); out = D n(silu(a)*b)
    residual (every sub-layer): x = n(n(x) + |alpha*alpha0/sigma0| * (n(out) - n(x)))

    sigma0 = init_method_std, alpha0 = ngpt_alpha_init,
    g0 = attention_output_gate_logit_scale_init (null -> sqrt(hidden_size)).

Two entry points:

* ``forward(ids)`` -- the full-sequence causal forward, one masked attention matrix per
  layer and no cache at all (llama.cpp's and vLLM's prefill semantics).
* ``new_cache(kv_mode)`` + ``step(cache, ids)`` / ``forward_chunked(ids, chunks)`` -- the
  incremental decode of the reference engine's ``forward_host``: K/V rows are kept per position in
  slots, each chunk's rows join (or overwrite) a slot and each row attends only up to
  itself.

How the two KV modes differ (spec section 2.4, seed ``slot_loop`` and ``overwrite``):

* input- and output-block attention layers have one cache each in both modes.
* ``per_loop``: recurrent attention layer i keeps one cache per loop index; loop l of a new
  token attends to the loop-l K/V of every earlier token. Results do not depend on how the
  sequence is chunked, so incremental decode == ``forward`` at every position (up to
  rounding), for any loop count -- but the loop count must stay fixed per sequence: a
  deeper loop than before has no rows for earlier tokens (a "hole"; the reference engine would index
  past its slot), and this reference raises ``ValueError`` there.
* ``last_loop``: one cache per recurrent attention layer. Loop l writes the current chunk's
  K/V at their positions, overwriting the previous loop's rows, so within a chunk loop l
  sees loop-l K/V of the chunk's own tokens but the *final* loop's K/V of every earlier
  chunk. Consequences: one chunk holding the whole sequence == ``forward`` == ``per_loop``
  exactly; with loops == 1 both modes agree for any chunking; with loops >= 2 and several
  chunks the logits depend on where the chunk boundaries fall (token-by-token decode
  differs observably from the full forward). The loop count may change from chunk to
  chunk without holes. Parity tests in this mode must use the same chunking as the
  engine; note that the reference engine's host forward splits one call into chunks of
  ``HOST_CHUNK = 64`` rows (and of 1 row on x86 for q8_2f weights), which are chunk
  boundaries in this sense.

Places where the reference engine and vLLM/llama.cpp differ, and what this reference does:

1. RoPE theta: vLLM/llama.cpp pick theta per layer from ``rope_profile_layers``
   (1 -> rope_theta, 2 -> rope_theta_2); the reference engine keys it on the layer char ('S' ->
   rope_theta_sliding, '*' -> rope_theta_full). ``from_hf`` follows the profile (the HF
   semantics, so it can catch a converter that collapses profiles wrongly); ``from_cmf``
   uses the reference engine's char rule. They agree whenever profile 2 <=> theta of 'S' layers.
2. RoPE precision: the reference engine builds ``inv_freq`` in f32 (``1/theta^(2i/hd)`` with
   theta as f32) and the angle ``pos * inv`` in f64; vLLM does both in f32. Default here: the
   reference engine (``rope_f32_inv=True``); ``rope_f32_inv=False`` gives an all-float64 table.
3. Loop count: vLLM accepts any positive count, llama.cpp at most 4, the reference engine at most
   ``MAX_LOOPS = 16`` per request and 0 through ``CMF_DORY_LOOPS``. Here 0..16.
4. KV modes: vLLM implements only ``per_loop`` (one Attention per virtual layer); llama.cpp
   and the reference engine implement both. Both are modelled.
5. Token ids >= vocab rows: the reference engine leaves the embedding row zero; vLLM would fail.
   Zero row here (negative ids raise).
6. ``full_window`` (``CMF_DORY_FULL_WINDOW``): a reference-engine option that gives full
   layers a window too; modelled as an optional argument, absent upstream.
7. exp/softmax/silu: the reference engine uses a Cephes f32 exp; here exact float64.
8. Not modelled (cortiq extensions): the early-exit gate (``CMF_DORY_GATE``,
   turbo router) as a policy, ``prompt_loops`` as a policy (``step(loops=...)`` per chunk
   lets a test reproduce both), the O(1) far field (``CMF_DORY_O1``) and exact rows.
   ``new_cache(carry=True)`` models what a gate leaves in a per_loop cache: a position
   that ran fewer passes reads, in a later loop's slot, its last pass's K/V (the
   reference engine has no rule there: it indexes past its slot).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

EPS = 1e-6
MAX_LOOPS = 16
KV_MODES = ("per_loop", "last_loop")


# --------------------------------------------------------------------------- helpers

def justnorm(x: np.ndarray) -> np.ndarray:
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last axis (eps inside the root of the sum)."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + EPS)


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def slerp(x: np.ndarray, out: np.ndarray, lr: np.ndarray) -> np.ndarray:
    """The nGPT residual step: ``n(n(x) + lr * (n(out) - n(x)))`` per row."""
    a, b = justnorm(x), justnorm(out)
    return justnorm(a + lr * (b - a))


def rope_inv_freq(head_dim: int, theta: float, f32: bool = True) -> np.ndarray:
    """``1 / theta^(2i/hd)`` for i < hd/2; in f32 like the reference engine's ``rope_inv_freq``."""
    i = np.arange(head_dim // 2)
    if f32:
        e = (2 * i).astype(np.float32) / np.float32(head_dim)
        inv = np.float32(1.0) / np.power(np.float32(theta), e, dtype=np.float32)
        return inv.astype(np.float64)
    return 1.0 / np.power(float(theta), 2.0 * i / head_dim)


def rope(x: np.ndarray, positions: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Half-split rotation of ``x[t, heads, hd]``: pair (i, i + hd/2) by ``pos * inv[i]``."""
    ang = positions.astype(np.float64)[:, None] * inv[None, :]        # [t, hd/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate((a * c - b * s, b * c + a * s), axis=-1)


def softmax(scores: np.ndarray) -> np.ndarray:
    top = np.max(scores, axis=-1, keepdims=True)
    e = np.exp(scores - top)
    return e / np.sum(e, axis=-1, keepdims=True)


# --------------------------------------------------------------------------- config

@dataclass(frozen=True)
class RefConfig:
    """What the forward needs, in HF terms. Built by ``from_hf`` or ``from_cmf_arch``."""
    hidden: int
    ffn: int
    vocab: int
    nh: int
    nkv: int
    hd: int
    pattern: str
    n_in: int
    n_rec: int
    n_out: int
    loops: int
    kv_mode: str
    window: int
    thetas: tuple            # per layer: RoPE base of an attention layer, None for '-'
    std: float
    alpha0: float
    gate0: float

    @classmethod
    def from_hf(cls, c: Mapping) -> RefConfig:
        n = int(c["num_hidden_layers"])
        pattern = c.get("hybrid_layer_pattern") or "S-S-S-*-" * (n // 8)
        hd = int(c.get("attention_head_dim", c.get("head_dim")))
        n_in, n_out = int(c.get("n_input_layers", 0)), int(c.get("n_output_layers", 0))
        n_rec = c.get("n_recurrent_layers")
        n_rec = n - n_in - n_out if n_rec is None else int(n_rec)
        theta1 = float(c.get("rope_theta", 10000.0))
        theta2 = c.get("rope_theta_2")
        theta2 = theta1 if theta2 is None else float(theta2)
        profiles = c.get("rope_profile_layers") or [1] * n
        for key in ("partial_rotary_factor", "partial_rotary_factor_2"):
            if c.get(key) not in (None, 1, 1.0):
                raise ValueError(f"{key} = {c.get(key)}: the reference rotates whole heads")
        if any(c.get("no_rope_layers") or []):
            raise ValueError("no_rope_layers: NoPE layers are not Dory")
        thetas = tuple(None if ch == "-" else (theta2 if profiles[i] == 2 else theta1)
                       for i, ch in enumerate(pattern))
        g0 = c.get("attention_output_gate_logit_scale_init")
        cfg = cls(hidden=int(c["hidden_size"]), ffn=int(c["intermediate_size"]),
                  vocab=int(c["vocab_size"]), nh=int(c["num_attention_heads"]),
                  nkv=int(c["num_key_value_heads"]), hd=hd, pattern=pattern,
                  n_in=n_in, n_rec=n_rec, n_out=n_out,
                  loops=int(c.get("n_recurrent_loops", 1)),
                  kv_mode=c.get("recurrent_kv_cache_mode", "per_loop"),
                  window=int(c.get("swa_window_size") or 0), thetas=thetas,
                  std=float(c.get("init_method_std", 0.02)),
                  alpha0=float(c.get("ngpt_alpha_init", 0.05)),
                  gate0=math.sqrt(int(c["hidden_size"])) if g0 is None else float(g0))
        cfg.check()
        return cfg

    @classmethod
    def from_cmf_arch(cls, arch: Mapping) -> RefConfig:
        d = arch["dory"]
        pattern = d["layer_pattern"]
        thetas = tuple(None if ch == "-" else float(
            d["rope_theta_sliding"] if ch == "S" else d["rope_theta_full"]) for ch in pattern)
        g0 = d.get("gate_logit_scale_init")
        cfg = cls(hidden=arch["hidden_size"], ffn=arch["intermediate_size"],
                  vocab=arch["vocab_size"], nh=arch["num_attention_heads"],
                  nkv=arch["num_kv_heads"], hd=arch["head_dim"], pattern=pattern,
                  n_in=d["n_input_layers"], n_rec=d["n_recurrent_layers"],
                  n_out=d["n_output_layers"], loops=d["n_recurrent_loops"],
                  kv_mode=d.get("recurrent_kv_cache_mode", "per_loop"),
                  window=d["sliding_window"], thetas=thetas,
                  std=float(d["initializer_range"]), alpha0=float(d["ngpt_alpha_init"]),
                  gate0=math.sqrt(arch["hidden_size"]) if g0 is None else float(g0))
        cfg.check()
        return cfg

    def check(self) -> None:
        if (len(self.pattern) != self.n_in + self.n_rec + self.n_out
                or set(self.pattern) - set("S*-")):
            raise ValueError(f"layer pattern {self.pattern!r} does not fit the block counts")
        if self.nh % self.nkv or self.hd % 2:
            raise ValueError("heads must divide into kv heads and head_dim must be even")
        if "S" in self.pattern and self.window <= 0:
            raise ValueError("sliding layers need a positive window")
        if self.kv_mode not in KV_MODES:
            raise ValueError(f"kv mode {self.kv_mode!r}")


# --------------------------------------------------------------------------- cache

class _Slot:
    """K/V rows of one (attention layer, loop slot), indexed by absolute position."""

    def __init__(self, nkv: int, hd: int):
        self.k = np.zeros((0, nkv, hd))
        self.v = np.zeros((0, nkv, hd))
        self.filled = np.zeros(0, dtype=bool)

    def write(self, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        end = pos0 + len(k)
        if end > len(self.filled):
            grow = end - len(self.filled)
            self.k = np.concatenate((self.k, np.zeros((grow,) + self.k.shape[1:])))
            self.v = np.concatenate((self.v, np.zeros((grow,) + self.v.shape[1:])))
            self.filled = np.concatenate((self.filled, np.zeros(grow, dtype=bool)))
        self.k[pos0:end], self.v[pos0:end] = k, v
        self.filled[pos0:end] = True

    def carry_from(self, prev: _Slot, end: int) -> None:
        """Positions below ``end`` this slot lacks and ``prev`` holds take prev's rows."""
        have = np.zeros(end, dtype=bool)
        have[:min(end, len(self.filled))] = self.filled[:end]
        hole = np.flatnonzero(~have[:len(prev.filled)] & prev.filled[:end])
        for p in hole:
            self.write(int(p), prev.k[p:p + 1], prev.v[p:p + 1])


class DoryCache:
    """One sequence's KV state for ``DoryReference.step``."""

    def __init__(self, cfg: RefConfig, kv_mode: str, full_window: int | None,
                 carry: bool = False):
        if kv_mode not in KV_MODES:
            raise ValueError(f"kv_mode {kv_mode!r}: want one of {KV_MODES}")
        self.cfg, self.kv_mode, self.full_window = cfg, kv_mode, full_window
        self.carry = carry
        self.pos = 0
        self.slots: dict[tuple[int, int], _Slot] = {}

    def rollback(self, n: int) -> None:
        """Forget positions >= n (the reference engine's ``DoryState::rollback``)."""
        for slot in self.slots.values():
            slot.filled[n:] = False
        self.pos = min(self.pos, n)

    def slot(self, layer: int, loop: int, pos0: int = 0) -> _Slot:
        """The reference engine's ``slot_loop``: per_loop recurrent layers get one slot per loop.
        With ``carry``, a per_loop slot of loop l > 0 first takes, for each earlier
        position it lacks (a token that ran fewer passes), the rows of loop l - 1: the
        K/V of the last pass that position ran."""
        c = self.cfg
        recurrent = c.n_in <= layer < c.n_in + c.n_rec
        sl = loop if (self.kv_mode == "per_loop" and recurrent) else 0
        key = (layer, sl)
        if key not in self.slots:
            self.slots[key] = _Slot(c.nkv, c.hd)
        if self.carry and sl > 0:
            self.slots[key].carry_from(self.slot(layer, sl - 1), pos0)
        return self.slots[key]


# --------------------------------------------------------------------------- model

_HF_FROM_CMF = (("model.embed_tokens.", "backbone.embeddings."),
                ("model.layers.", "backbone.layers."))


class DoryReference:
    """Float64 Dory forward over an HF checkpoint (names ``backbone.*`` / ``lm_head.*``)."""

    def __init__(self, tensors: Mapping[str, np.ndarray], config: Mapping | RefConfig, *,
                 rope_f32_inv: bool = True):
        cfg = config if isinstance(config, RefConfig) else RefConfig.from_hf(config)
        self.cfg = c = cfg
        w = lambda name: np.asarray(tensors[name], dtype=np.float64)  # noqa: E731
        self.embed = w("backbone.embeddings.weight")                  # [V, H]
        self.head = w("lm_head.weight")                               # [V, H]
        self.logit_scale = w("lm_head.logit_scale") / c.std           # [V]
        alpha_f = c.alpha0 / c.std
        sqk_f = math.sqrt(c.hd) / c.std
        gate_f = math.sqrt(c.gate0) / c.std
        suv_f = math.sqrt(c.hidden)
        self.layers = []
        for i, ch in enumerate(c.pattern):
            p, m = f"backbone.layers.{i}", f"backbone.layers.{i}.mixer"
            if ch == "-":
                self.layers.append(dict(
                    kind=ch, gate=w(f"{m}.gate_proj.weight"), up=w(f"{m}.up_proj.weight"),
                    down=w(f"{m}.down_proj.weight"),
                    suv_gate=w(f"{m}.suv_gate") * suv_f, suv_up=w(f"{m}.suv_up") * suv_f,
                    lr=np.abs(w(f"{p}.mlp_alpha") * alpha_f)))
            else:
                self.layers.append(dict(
                    kind=ch, q=w(f"{m}.q_proj.weight"), k=w(f"{m}.k_proj.weight"),
                    v=w(f"{m}.v_proj.weight"), g=w(f"{m}.g_proj.weight"),
                    o=w(f"{m}.o_proj.weight"),
                    sq=((w(f"{m}.sqk") * sqk_f) ** 2).reshape(c.nh, c.hd),
                    sg=(w(f"{m}.s_gate") * gate_f) ** 2,
                    lr=np.abs(w(f"{p}.attn_alpha") * alpha_f),
                    inv=rope_inv_freq(c.hd, c.thetas[i], f32=rope_f32_inv)))
        self._check_shapes()

    @classmethod
    def from_cmf(cls, arch: Mapping, tensors: Mapping[str, np.ndarray], **kw) -> DoryReference:
        """Build from CMF tensor names (``model.*``) and a CMF header ``arch`` dict."""
        hf = {}
        for name, arr in tensors.items():
            for a, b in _HF_FROM_CMF:
                if name.startswith(a):
                    name = b + name[len(a):]
                    break
            hf[name] = arr
        return cls(hf, RefConfig.from_cmf_arch(arch), **kw)

    @classmethod
    def from_cmf_file(cls, cf, **kw) -> DoryReference:
        """From an open ``cortiq.cmf`` file (dequantized tensors, its header ``arch``)."""
        return cls.from_cmf(cf.arch, {n: cf.tensor(n) for n in cf.names()}, **kw)

    def _check_shapes(self) -> None:
        c = self.cfg
        qs, kvs = c.nh * c.hd, c.nkv * c.hd
        want = {"embed": (c.vocab, c.hidden), "head": (c.vocab, c.hidden)}
        for key, shape in want.items():
            if getattr(self, key).shape != shape:
                raise ValueError(f"{key}: shape {getattr(self, key).shape}, want {shape}")
        for i, L in enumerate(self.layers):
            shapes = (dict(gate=(c.ffn, c.hidden), up=(c.ffn, c.hidden), down=(c.hidden, c.ffn),
                           suv_gate=(c.ffn,), suv_up=(c.ffn,), lr=(c.hidden,))
                      if L["kind"] == "-" else
                      dict(q=(qs, c.hidden), k=(kvs, c.hidden), v=(kvs, c.hidden),
                           g=(qs, c.hidden), o=(c.hidden, qs), sg=(qs,), lr=(c.hidden,)))
            for key, shape in shapes.items():
                if L[key].shape != shape:
                    raise ValueError(f"layer {i} {key}: shape {L[key].shape}, want {shape}")

    # ---------------------------------------------------------------- pieces
    def _embed(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if (ids < 0).any():
            raise ValueError("negative token id")
        h = np.zeros((len(ids), self.cfg.hidden))
        ok = ids < self.embed.shape[0]
        h[ok] = self.embed[ids[ok]]
        return h

    def _qkvg(self, L, x, positions):
        c = self.cfg
        t = len(x)
        q = (x @ L["q"].T).reshape(t, c.nh, c.hd)
        k = (x @ L["k"].T).reshape(t, c.nkv, c.hd)
        v = (x @ L["v"].T).reshape(t, c.nkv, c.hd)
        g = x @ L["g"].T                                               # [t, nh*hd]
        q = justnorm(rope(q, positions, L["inv"])) * L["sq"][None]
        k = justnorm(rope(k, positions, L["inv"]))
        return q, k, v, g

    def _window(self, L, full_window):
        if L["kind"] == "S":
            return self.cfg.window
        return full_window if full_window else None

    def _attend(self, L, x, q, K, V, qpos, kpos, window, g):
        """Softmax attention of queries at ``qpos`` over keys at ``kpos``, then gate+norm+O."""
        c = self.cfg
        rep = c.nh // c.nkv
        Kq, Vq = np.repeat(K, rep, axis=1), np.repeat(V, rep, axis=1)     # [s, nh, hd]
        scores = np.einsum("thd,shd->hts", q, Kq) / math.sqrt(c.hd)
        allowed = kpos[None, :] <= qpos[:, None]
        if window is not None:
            allowed &= qpos[:, None] - kpos[None, :] < window
        scores = np.where(allowed[None], scores, -np.inf)
        y = np.einsum("hts,shd->thd", softmax(scores), Vq).reshape(len(x), c.nh * c.hd)
        y = justnorm(y * sigmoid(g * L["sg"]))
        return slerp(x, y @ L["o"].T, L["lr"])

    def _mlp(self, L, x):
        a = (x @ L["gate"].T) * L["suv_gate"]
        b = (x @ L["up"].T) * L["suv_up"]
        return slerp(x, justnorm(silu(a) * b) @ L["down"].T, L["lr"])

    def _logits(self, h):
        return (h @ self.head.T) * self.logit_scale

    def _loops(self, loops):
        loops = self.cfg.loops if loops is None else int(loops)
        if not 0 <= loops <= MAX_LOOPS:
            raise ValueError(f"loops = {loops}: want 0..{MAX_LOOPS}")
        return loops

    def _stack(self, h, layer_fn, loops):
        """Input block, ``loops`` passes of the recurrent block, output block."""
        c = self.cfg
        for li in range(c.n_in):
            h = layer_fn(li, 0, h)
        inp = h
        state = inp
        for loop in range(loops):
            h = justnorm(state + inp)
            for li in range(c.n_in, c.n_in + c.n_rec):
                h = layer_fn(li, loop, h)
            state = justnorm(h)
        h = state
        for li in range(c.n_in + c.n_rec, len(c.pattern)):
            h = layer_fn(li, 0, h)
        return h

    # ---------------------------------------------------------------- full sequence
    def forward(self, ids: Sequence[int], loops: int | None = None, *,
                full_window: int | None = None, return_hidden: bool = False) -> np.ndarray:
        """Logits ``[T, vocab]`` of a full causal pass over ``ids`` (positions 0..T-1)."""
        loops = self._loops(loops)
        h = self._embed(ids)
        pos = np.arange(len(h))

        def layer(li, loop, x):
            L = self.layers[li]
            if L["kind"] == "-":
                return self._mlp(L, x)
            q, k, v, g = self._qkvg(L, x, pos)
            return self._attend(L, x, q, k, v, pos, pos, self._window(L, full_window), g)

        h = self._stack(h, layer, loops)
        return h if return_hidden else self._logits(h)

    # ---------------------------------------------------------------- incremental
    def new_cache(self, kv_mode: str | None = None, full_window: int | None = None,
                  carry: bool = False) -> DoryCache:
        """``carry``: per_loop holes take the previous loop's rows (``DoryCache.slot``),
        cortiq's rule for tokens an early-exit gate let through after fewer passes."""
        return DoryCache(self.cfg, kv_mode or self.cfg.kv_mode, full_window, carry)

    def step(self, cache: DoryCache, ids: Sequence[int], loops: int | None = None) -> np.ndarray:
        """Run one chunk at ``cache.pos``; returns its logits ``[len(ids), vocab]``."""
        loops = self._loops(loops)
        h = self._embed(ids)
        t, pos0 = len(h), cache.pos
        qpos = pos0 + np.arange(t)

        def layer(li, loop, x):
            L = self.layers[li]
            if L["kind"] == "-":
                return self._mlp(L, x)
            q, k, v, g = self._qkvg(L, x, qpos)
            slot = cache.slot(li, loop, pos0)
            slot.write(pos0, k, v)           # last_loop: a later loop overwrites these rows
            window = self._window(L, cache.full_window)
            lo = 0 if window is None else max(0, pos0 + 1 - window)
            if not slot.filled[lo:pos0 + t].all():
                missing = lo + int(np.argmin(slot.filled[lo:pos0 + t]))
                raise ValueError(
                    f"layer {li} loop {loop}: no cached K/V for position {missing} "
                    f"({cache.kv_mode}); the loop count changed mid-sequence")
            kpos = np.arange(lo, pos0 + t)
            return self._attend(L, x, q, slot.k[lo:pos0 + t], slot.v[lo:pos0 + t],
                                qpos, kpos, window, g)

        h = self._stack(h, layer, loops)
        cache.pos = pos0 + t
        return self._logits(h)

    def forward_chunked(self, ids: Sequence[int], chunks: int | Sequence[int],
                        loops: int | Sequence[int] | None = None, *, kv_mode: str | None = None,
                        full_window: int | None = None) -> np.ndarray:
        """Incremental forward: ``chunks`` is a chunk size or the list of chunk lengths;
        ``loops`` one count or one per chunk. Returns the logits of every position."""
        ids = list(ids)
        if isinstance(chunks, int):
            sizes = [min(chunks, len(ids) - a) for a in range(0, len(ids), chunks)]
        else:
            sizes = list(chunks)
        if sum(sizes) != len(ids) or min(sizes, default=1) < 1:
            raise ValueError(f"chunk sizes {sizes} do not cover {len(ids)} tokens")
        per_chunk = loops if isinstance(loops, (list, tuple)) else [loops] * len(sizes)
        cache = self.new_cache(kv_mode, full_window)
        out, at = [], 0
        for n, lp in zip(sizes, per_chunk):
            out.append(self.step(cache, ids[at:at + n], lp))
            at += n
        return np.concatenate(out)
