"""Train cortiq's bundled demo model: a tiny Dory on Python standard-library docstrings.

Run (about 25 minutes on 2 cores; PyTorch is a tool dependency only, never a runtime one)::

    pip install torch==2.13.0 tokenizers safetensors
    python tools/train_demo.py --out /tmp/demo_hf --cmf src/cortiq/data/demo.cmf \
        --ref-logits tests/data/demo_reference_logits.json

What it does, in order:

1. **Corpus.** Every docstring (module, class, function) of the ``.py`` files of the running
   interpreter's standard library (``sysconfig`` "stdlib"; test suites, ``idlelib``,
   ``site-packages`` and ``lib2to3`` fixtures left out), cleaned with ``inspect.cleandoc``.
   Why this text: it is English prose about programming, it is on every machine that runs
   Python (no download, no network), and it is covered by the PSF License Agreement, which
   allows redistribution of derived works -- the model's weights and its tokenizer are
   shipped inside cortiq. Function and class docstrings are also written a second time as
   ChatML turns (``user: What does `name` do?`` / ``assistant: <first paragraph>``) so that
   a prompt run through the bundled chat template gets an answer-shaped reply.
   5 % of the *files* (picked by a seeded RNG) are held out for the perplexity.
2. **Tokenizer.** Byte-level BPE trained with ``tokenizers`` on the training split only;
   ``<|endoftext|>`` = 0, ``<|im_start|>`` = 1, ``<|im_end|>`` = 2 are the special tokens.
3. **Model.** ``Dory`` below: the Dory forward of spec section 2 (the same as
   ``tests/reference/dory_numpy.py``, checked by ``tests/test_demo_model.py`` in float64),
   with parameters named exactly like a Hugging Face Dory checkpoint (``backbone.*``,
   ``lm_head.*``) and a ``config.json`` with vLLM's keys, so the result is an ordinary HF
   directory that ``cortiq.convert.from_hf`` converts.
4. **Training.** Adam (no weight decay: nGPT's matrices live on the unit sphere), linear
   warm-up then cosine decay, next-token cross-entropy on random windows of the training
   ids. After every optimizer step the matrices are put back on the unit sphere as nGPT
   does (``normalize_matrices`` of the nGPT paper's code): the rows over the input dimension
   of the embedding, of ``lm_head`` and of q/k/v/g/gate/up; the columns (over the output
   dimension) of o_proj and down_proj. The scale vectors (alphas, sqk, s_gate, suv,
   logit_scale) are free parameters stored in the checkpoint's raw parameterisation (their
   effective values are derived by the load-time transforms of spec section 2.2); they
   start where nGPT starts them: raw = init_method_std (effective alpha = ngpt_alpha_init,
   s_q = head_dim, s_g = g0, logit scale 1), suv raw = 1 (effective sqrt(hidden)).
5. **Output.** The HF directory (``model.safetensors`` in f32, ``config.json``,
   ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``,
   ``generation_config.json``, ``train_log.json`` with the recipe and the numbers), the
   q8_row CMF (``--cmf``), and reference logits of the f32 torch forward over the weights
   of that CMF file (``--ref-logits``) for the runtime parity test when torch is absent.

The shipped run (``tools/demo_train_log.json``, ``tools/demo_train_output.txt``): seed 1234,
the RECIPE below, CPython 3.11.7's stdlib (574 files, 29 held out; 634,464 training and
91,652 held-out tokens), 6,637,056 parameters; final training loss 3.78 (EMA of the last
steps; 3.96 re-evaluated on a training sample), held-out loss 4.461 = perplexity 86.6;
training 1769 s wall / 987 s CPU with ``--threads 1`` on the 2-core machine while other
jobs shared it. ``src/cortiq/data/demo.cmf`` (q8_row) is 7,148,405 bytes. The run was not
repeated to check bit-for-bit reproducibility (more threads may change the last bits).
"""
from __future__ import annotations

import argparse
import ast
import gzip
import inspect
import json
import math
import os
import re
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

try:
    import torch
    from torch import nn
    import torch.nn.functional as F
except ImportError:  # the module is importable without torch for the corpus helpers
    torch = nn = F = None

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
EPS = 1e-6

#: The recipe. Everything that decides the weights is here (plus the stdlib's text).
RECIPE = dict(
    seed=1234,
    vocab=4096,
    hidden=256,
    heads=4,
    kv_heads=2,
    head_dim=64,
    mlp=640,
    pattern="S-*-S-S-*-S-",
    blocks=(4, 4, 4),
    loops=2,
    kv_mode="per_loop",
    window=64,
    rope_theta=1.0e5,        # '*' layers (rope profile 1)
    rope_theta_2=1.0e4,      # 'S' layers (rope profile 2)
    std=0.0625,              # init_method_std = 1/sqrt(hidden), nGPT's base scale
    alpha_init=0.05,
    seq=256,
    batch=8,
    steps=700,
    warmup=50,
    lr=3.0e-3,
    lr_min_frac=0.05,
    grad_clip=1.0,
    holdout_frac=0.05,
    chat_frac=1.0,           # every function/class docstring also as a ChatML turn
    threads=2,
    max_pos=4096,
)


# ============================================================================ corpus

_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
              "lib2to3", "idlelib", "turtledemo", "ensurepip", "pydoc_data", "config-3"}


def stdlib_files(root: str | None = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(part in _SKIP_DIRS or part.startswith("config-") for part in rel[:-1]):
            continue
        if rel[-1].startswith("test_"):
            continue
        out.append(p)
    return out


def _clean(doc: str) -> str:
    doc = inspect.cleandoc(doc).strip()
    doc = re.sub(r"[ \t]+\n", "\n", doc)
    doc = re.sub(r"\n{3,}", "\n\n", doc)
    return doc


def file_docstrings(path: Path) -> list[tuple[str | None, str]]:
    """``[(name or None, docstring)]`` of a module, its classes and functions, in order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    out = []
    mod = ast.get_docstring(tree, clean=False)
    if mod:
        out.append((None, _clean(mod)))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            d = ast.get_docstring(node, clean=False)
            if d:
                out.append((node.name, _clean(d)))
    return [(n, d) for n, d in out if len(d) >= 24]


def chat_turn(name: str, doc: str) -> str:
    first = doc.split("\n\n")[0].strip()
    return (f"<|im_start|>user\nWhat does `{name}` do?<|im_end|>\n"
            f"<|im_start|>assistant\n{first}<|im_end|>\n")


def build_corpus(seed: int, holdout_frac: float, chat_frac: float, root: str | None = None):
    """``(train_docs, heldout_docs, info)``: lists of document strings. Held-out documents are
    whole files; the split is a seeded permutation of the sorted file list."""
    files = stdlib_files(root)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(files))
    n_hold = max(1, round(holdout_frac * len(files)))
    hold = set(order[:n_hold].tolist())
    train, held = [], []
    crng = np.random.default_rng(seed + 1)
    for i, p in enumerate(files):
        docs = []
        for name, d in file_docstrings(p):
            docs.append(d)
            if name and crng.random() < chat_frac:
                docs.append(chat_turn(name, d))
        (held if i in hold else train).extend(docs)
    info = dict(source="Python standard library docstrings (PSF License)",
                python=sys.version.split()[0], files=len(files), heldout_files=n_hold,
                train_docs=len(train), heldout_docs=len(held),
                train_chars=sum(map(len, train)), heldout_chars=sum(map(len, held)))
    return train, held, info


WORD_RE = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    """The word tokenizer the vocabulary test uses (lower-cased alphabetic runs)."""
    return [w.lower() for w in WORD_RE.findall(text)]


# ============================================================================ tokenizer

def train_tokenizer(docs: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, min_frequency=2)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def encode_docs(tok, docs: list[str]) -> np.ndarray:
    eot = tok.token_to_id("<|endoftext|>")
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.int64)


# ============================================================================ model

def hf_config(r: dict = RECIPE, vocab: int | None = None, eos_id: int = 0) -> dict:
    """The HF ``config.json`` (vLLM ``DoryConfig`` keys, as tests/reference/hf_tiny.py)."""
    pattern, (n_in, n_rec, n_out) = r["pattern"], r["blocks"]
    n = len(pattern)
    return {
        "architectures": ["DoryForCausalLM"], "model_type": "dory", "dory_format_version": 1,
        "torch_dtype": "float32", "vocab_size": vocab or r["vocab"],
        "hidden_size": r["hidden"], "num_hidden_layers": n, "intermediate_size": r["mlp"],
        "num_attention_heads": r["heads"], "num_key_value_heads": r["kv_heads"],
        "attention_head_dim": r["head_dim"], "head_dim": r["head_dim"],
        "max_position_embeddings": r["max_pos"], "tie_word_embeddings": False,
        "hybrid_layer_pattern": pattern, "swa_window_size": r["window"],
        "swa_num_attention_heads": r["heads"], "swa_num_key_value_heads": r["kv_heads"],
        "swa_head_dim": r["head_dim"], "rope_theta": r["rope_theta"],
        "partial_rotary_factor": 1.0, "rope_theta_2": r["rope_theta_2"],
        "partial_rotary_factor_2": 1.0,
        "rope_profile_layers": [2 if ch == "S" else 1 for ch in pattern],
        "no_rope_layers": [0] * n, "ngpt": True, "fngpt": True,
        "init_method_std": r["std"], "ngpt_alpha_init": r["alpha_init"],
        "ngpt_enable_final_norm": False, "attention_output_gate": True,
        "attention_output_gate_logit_scale_init": None, "mlp_hidden_act": "silu",
        "mlp_bias": False, "attention_bias": False, "n_input_layers": n_in,
        "n_recurrent_layers": n_rec, "n_output_layers": n_out, "n_recurrent_loops": r["loops"],
        "recurrent_kv_cache_mode": r["kv_mode"], "initial_state": "input_copy",
        "input_transform": "residual", "output_transform": "replace", "mixer_type": None,
        "bos_token_id": None, "eos_token_id": eos_id,
    }


def justnorm(x):
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last axis (spec 2.3)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + EPS)


def slerp(x, out, lr):
    a, b = justnorm(x), justnorm(out)
    return justnorm(a + lr * (b - a))


def rope_tables(hd: int, theta: float, t: int, dtype):
    from cortiq.models.rope import inv_freq  # float32, the arithmetic transformers uses
    ang = torch.arange(t, dtype=torch.float64)[:, None] * torch.from_numpy(inv_freq(hd, theta)).double()
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def apply_rope(x, cos, sin):
    """Half-split rotation of ``x[B, T, heads, hd]``: pairs (i, i + hd/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat((a * c - b * s, b * c + a * s), dim=-1)


class Attention(nn.Module if nn else object):
    def __init__(self, c: dict):
        super().__init__()
        H, nh, nkv, hd = (c["hidden_size"], c["num_attention_heads"],
                          c["num_key_value_heads"], c["attention_head_dim"])
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.g_proj = nn.Linear(H, nh * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.sqk = nn.Parameter(torch.empty(nh * hd))
        self.s_gate = nn.Parameter(torch.empty(nh * hd))


class MLP(nn.Module if nn else object):
    def __init__(self, c: dict):
        super().__init__()
        H, inter = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)
        self.suv_gate = nn.Parameter(torch.empty(inter))
        self.suv_up = nn.Parameter(torch.empty(inter))


class Layer(nn.Module if nn else object):
    def __init__(self, c: dict, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "-":
            self.mixer = MLP(c)
            self.mlp_alpha = nn.Parameter(torch.empty(c["hidden_size"]))
        else:
            self.mixer = Attention(c)
            self.attn_alpha = nn.Parameter(torch.empty(c["hidden_size"]))


class LMHead(nn.Module if nn else object):
    def __init__(self, V: int, H: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(V, H))
        self.logit_scale = nn.Parameter(torch.empty(V))


class Backbone(nn.Module if nn else object):
    def __init__(self, c: dict):
        super().__init__()
        self.embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c, ch) for ch in c["hybrid_layer_pattern"])


class Dory(nn.Module if nn else object):
    """The Dory forward of spec section 2.3 over HF-named parameters (full sequence)."""

    def __init__(self, config: dict):
        super().__init__()
        c = self.config = dict(config)
        self.H, self.nh, self.nkv, self.hd = (c["hidden_size"], c["num_attention_heads"],
                                              c["num_key_value_heads"], c["attention_head_dim"])
        self.pattern = c["hybrid_layer_pattern"]
        self.n_in, self.n_out = c["n_input_layers"], c["n_output_layers"]
        self.n_rec = c.get("n_recurrent_layers") or len(self.pattern) - self.n_in - self.n_out
        self.loops = c["n_recurrent_loops"]
        self.window = c["swa_window_size"]
        self.std = c["init_method_std"]
        self.alpha0 = c["ngpt_alpha_init"]
        g0 = c.get("attention_output_gate_logit_scale_init")
        self.g0 = math.sqrt(self.H) if g0 is None else g0
        prof = c.get("rope_profile_layers") or [1] * len(self.pattern)
        t1, t2 = c["rope_theta"], c.get("rope_theta_2") or c["rope_theta"]
        self.thetas = [t2 if prof[i] == 2 else t1 for i in range(len(self.pattern))]
        self.backbone = Backbone(c)
        self.lm_head = LMHead(c["vocab_size"], self.H)

    # ------------------------------------------------------------ init / sphere
    @torch.no_grad() if torch else (lambda f: f)
    def init_weights(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * self.std)
            elif name.endswith(("suv_gate", "suv_up")):
                p.fill_(1.0)
            else:       # alphas, sqk, s_gate, logit_scale: effective nGPT init values
                p.fill_(self.std)
        self.normalize_()

    def sphere_params(self):
        """``(param, dim)`` of every matrix nGPT keeps on the unit sphere."""
        out = [(self.backbone.embeddings.weight, 1), (self.lm_head.weight, 1)]
        for L in self.backbone.layers:
            m = L.mixer
            if L.kind == "-":
                out += [(m.gate_proj.weight, 1), (m.up_proj.weight, 1), (m.down_proj.weight, 0)]
            else:
                out += [(m.q_proj.weight, 1), (m.k_proj.weight, 1), (m.v_proj.weight, 1),
                        (m.g_proj.weight, 1), (m.o_proj.weight, 0)]
        return out

    @torch.no_grad() if torch else (lambda f: f)
    def normalize_(self) -> None:
        for p, dim in self.sphere_params():
            p.div_(p.norm(dim=dim, keepdim=True).clamp_min(1e-12))

    # ------------------------------------------------------------ forward
    def _attn(self, L, x, i, tabs, masks):
        m = L.mixer
        B, T, _ = x.shape
        nh, nkv, hd = self.nh, self.nkv, self.hd
        cos, sin = tabs[self.thetas[i]]
        q = apply_rope(m.q_proj(x).view(B, T, nh, hd), cos, sin)
        k = apply_rope(m.k_proj(x).view(B, T, nkv, hd), cos, sin)
        v = m.v_proj(x).view(B, T, nkv, hd)
        g = m.g_proj(x)
        sq = ((m.sqk * (math.sqrt(hd) / self.std)) ** 2).view(nh, hd)
        q = justnorm(q) * sq
        k = justnorm(k)
        rep = nh // nkv
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[L.kind])
        y = y.transpose(1, 2).reshape(B, T, nh * hd)
        sg = (m.s_gate * (math.sqrt(self.g0) / self.std)) ** 2
        y = justnorm(y * torch.sigmoid(g * sg))
        lr = torch.abs(L.attn_alpha * (self.alpha0 / self.std))
        return slerp(x, m.o_proj(y), lr)

    def _mlp(self, L, x):
        m = L.mixer
        f = math.sqrt(self.H)
        a = m.gate_proj(x) * (m.suv_gate * f)
        b = m.up_proj(x) * (m.suv_up * f)
        out = m.down_proj(justnorm(F.silu(a) * b))
        lr = torch.abs(L.mlp_alpha * (self.alpha0 / self.std))
        return slerp(x, out, lr)

    def hidden(self, ids, loops: int | None = None):
        """Final hidden rows ``[B, T, H]`` for ids ``[B, T]`` (positions 0..T-1)."""
        if ids.ndim == 1:
            ids = ids[None]
        _B, T = ids.shape
        dt = self.backbone.embeddings.weight.dtype
        tabs = {th: rope_tables(self.hd, th, T, dt) for th in set(self.thetas)}
        pos = torch.arange(T)
        causal = pos[None, :] <= pos[:, None]
        masks = {"*": causal, "S": causal & (pos[:, None] - pos[None, :] < self.window)}
        layers = self.backbone.layers

        def run(i, x):
            L = layers[i]
            return self._mlp(L, x) if L.kind == "-" else self._attn(L, x, i, tabs, masks)

        h = self.backbone.embeddings(ids)
        for i in range(self.n_in):
            h = run(i, h)
        inp = state = h
        for _ in range(self.loops if loops is None else loops):
            h = justnorm(state + inp)
            for i in range(self.n_in, self.n_in + self.n_rec):
                h = run(i, h)
            state = justnorm(h)
        h = state
        for i in range(self.n_in + self.n_rec, len(self.pattern)):
            h = run(i, h)
        return h

    def logits(self, h):
        return (h @ self.lm_head.weight.T) * (self.lm_head.logit_scale / self.std)

    def forward(self, ids, loops: int | None = None):
        return self.logits(self.hidden(ids, loops))

    # ------------------------------------------------------------ HF I/O
    @classmethod
    def from_tensors(cls, tensors: dict, config: dict, dtype=None) -> Dory:
        """A model holding the given HF-named arrays (numpy or torch)."""
        dtype = dtype or torch.float32
        m = cls(config).to(dtype)
        sd = {k: torch.as_tensor(np.asarray(v)).to(dtype) for k, v in tensors.items()}
        m.load_state_dict(sd, strict=True)
        return m

    def hf_tensors(self) -> dict[str, np.ndarray]:
        return {k: v.detach().float().contiguous().numpy() for k, v in self.state_dict().items()}


# ============================================================================ training

def lr_at(step: int, r: dict) -> float:
    if step < r["warmup"]:
        return r["lr"] * (step + 1) / r["warmup"]
    t = (step - r["warmup"]) / max(1, r["steps"] - r["warmup"])
    lo = r["lr"] * r["lr_min_frac"]
    return lo + 0.5 * (r["lr"] - lo) * (1 + math.cos(math.pi * min(1.0, t)))


@torch.no_grad() if torch else (lambda f: f)
def evaluate(model: Dory, ids: np.ndarray, seq: int, max_windows: int = 10**9,
             batch: int = 8) -> tuple[float, int]:
    """Mean next-token loss over non-overlapping windows of ``seq + 1`` ids."""
    model.eval()
    n = min((len(ids) - 1) // seq, max_windows)
    tot, cnt = 0.0, 0
    for a in range(0, n, batch):
        rows = [ids[(a + j) * seq:(a + j) * seq + seq + 1] for j in range(min(batch, n - a))]
        x = torch.as_tensor(np.stack(rows))
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                               reduction="sum")
        tot += float(loss)
        cnt += x[:, 1:].numel()
    model.train()
    return tot / max(cnt, 1), cnt


def write_hf_dir(out: Path, model: Dory, tok, config: dict, log: dict) -> None:
    from safetensors.numpy import save_file
    out.mkdir(parents=True, exist_ok=True)
    save_file(model.hf_tensors(), str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(out / "tokenizer.json"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "bos_token": None, "pad_token": "<|endoftext|>",
        "model_max_length": config["max_position_embeddings"]}, indent=2))
    (out / "chat_template.jinja").write_text(CHATML)
    (out / "train_log.json").write_text(json.dumps(log, indent=2))


REF_PROMPTS = [
    "Return the number of items in the sequence.",
    "<|im_start|>user\nWhat does `join` do?<|im_end|>\n<|im_start|>assistant\n",
    "This module provides functions for",
]


def reference_logits(cmf_path: str, out_json: str, prompts=REF_PROMPTS) -> None:
    """Torch f32 logits of the weights stored in ``cmf_path`` (dequantized), for the parity
    test of the runtime when torch is absent: rows 0, middle and last of a few prompts (each
    row of a full forward attends to every earlier position, so these exercise all of it)."""
    from cortiq import cmf
    from cortiq.convert.hf_dory import hf_name
    from tokenizers import Tokenizer
    with cmf.open(cmf_path) as cf:
        config = cf.header["provenance"]["hf_config"]
        tensors = {hf_name(n): cf.tensor(n) for n in cf.names()}
        tok = Tokenizer.from_str(cf.tokenizer_json().decode())
    model = Dory.from_tensors(tensors, config, torch.float32).eval()
    rows = []
    with torch.no_grad():
        for p in prompts:
            ids = tok.encode(p).ids
            lg = model(torch.as_tensor([ids]))[0].numpy()
            at = sorted({0, len(ids) // 2, len(ids) - 1})
            rows.append({"prompt": p, "ids": ids, "rows": at,
                         "logits": [[float(f"{v:.6g}") for v in lg[i]] for i in at]})
    blob = json.dumps({"source": os.path.basename(cmf_path), "torch": torch.__version__,
                       "dtype": "float32", "prompts": rows}, separators=(",", ":"))
    with gzip.open(out_json + ".tmp", "wt", compresslevel=9) as f:
        f.write(blob)
    os.replace(out_json + ".tmp", out_json)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/cortiq_demo_hf", help="HF output directory")
    ap.add_argument("--cmf", default=None, help="also convert to this CMF path (q8_row)")
    ap.add_argument("--ref-logits", default=None, help="write reference logits (.json.gz)")
    ap.add_argument("--words", default=None, help="write the training words (.txt.gz)")
    ap.add_argument("--steps", type=int, default=None, help="override the step count")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--convert-only", action="store_true",
                    help="skip training: convert --out (an HF dir this script wrote)")
    args = ap.parse_args(argv)
    if args.convert_only:
        return export(Path(args.out), args.cmf, args.ref_logits)

    r = dict(RECIPE)
    if args.steps is not None:
        r["steps"] = args.steps
        r["warmup"] = min(r["warmup"], max(1, args.steps // 10))
    torch.set_num_threads(args.threads or r["threads"])
    torch.manual_seed(r["seed"])
    t0 = time.time()

    train_docs, held_docs, cinfo = build_corpus(r["seed"], r["holdout_frac"], r["chat_frac"])
    tok = train_tokenizer(train_docs, r["vocab"])
    train_ids = encode_docs(tok, train_docs)
    held_ids = encode_docs(tok, held_docs)
    V = tok.get_vocab_size()
    cinfo.update(train_tokens=len(train_ids), heldout_tokens=len(held_ids), vocab=V)
    print(f"corpus: {json.dumps(cinfo)} ({time.time() - t0:.1f}s)", flush=True)
    if args.words:
        vocab_words = sorted(set(words("\n".join(train_docs))))
        with gzip.open(args.words + ".tmp", "wt", compresslevel=9) as f:
            f.write("\n".join(vocab_words) + "\n")
        os.replace(args.words + ".tmp", args.words)

    config = hf_config(r, vocab=V, eos_id=tok.token_to_id("<|endoftext|>"))
    model = Dory(config)
    model.init_weights(r["seed"])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters, pattern {r['pattern']} blocks {r['blocks']} "
          f"loops {r['loops']}", flush=True)
    opt = torch.optim.Adam(model.parameters(), lr=r["lr"], betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(r["seed"] + 2)
    seq, B = r["seq"], r["batch"]
    hist = []
    t_train, c_train = time.time(), time.process_time()
    ema = None
    for step in range(r["steps"]):
        for gp in opt.param_groups:
            gp["lr"] = lr_at(step, r)
        starts = rng.integers(0, len(train_ids) - seq - 1, size=B)
        x = torch.as_tensor(np.stack([train_ids[s:s + seq + 1] for s in starts]))
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if r["grad_clip"]:
            nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
        opt.step()
        model.normalize_()
        lv = float(loss.detach())
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        if step % args.log_every == 0 or step == r["steps"] - 1:
            el, cpu = time.time() - t_train, time.process_time() - c_train
            print(f"step {step:5d} loss {lv:.4f} ema {ema:.4f} lr {lr_at(step, r):.2e} "
                  f"wall {el:7.1f}s cpu {cpu:7.1f}s {(step + 1) * B * seq / el:6.0f} tok/s",
                  flush=True)
            hist.append((step, round(lv, 4)))
    train_time, train_cpu = time.time() - t_train, time.process_time() - c_train
    final_train, _ = evaluate(model, train_ids[: (len(held_ids) // 2)], seq, 64)
    held_loss, held_n = evaluate(model, held_ids, seq)
    log = dict(recipe=r, corpus=cinfo, parameters=n_params, torch=torch.__version__,
               final_loss_ema=round(ema, 4), final_loss_last=round(lv, 4),
               train_eval_loss=round(final_train, 4), heldout_loss=round(held_loss, 4),
               heldout_perplexity=round(math.exp(held_loss), 3), heldout_tokens=held_n,
               train_seconds=round(train_time, 1), train_cpu_seconds=round(train_cpu, 1),
               threads=torch.get_num_threads(), total_seconds=round(time.time() - t0, 1),
               loss_history=hist)
    print(f"final: loss (ema) {ema:.4f}, train-eval loss {final_train:.4f}, held-out loss "
          f"{held_loss:.4f} = perplexity {math.exp(held_loss):.2f} over {held_n} tokens; "
          f"training {train_time:.0f}s wall, {train_cpu:.0f}s CPU", flush=True)
    out = Path(args.out)
    write_hf_dir(out, model, tok, config, log)
    print(f"wrote {out}", flush=True)
    print(json.dumps({k: v for k, v in log.items() if k != "loss_history"}, indent=1))
    return export(out, args.cmf, args.ref_logits)


def export(hf_dir: Path, cmf_path: str | None, ref_logits: str | None) -> int:
    """HF directory -> q8_row CMF with our converter (+ the torch reference logits)."""
    if cmf_path:
        from cortiq.convert import from_hf
        from_hf(hf_dir, cmf_path, quant="q8_row", progress=False)
        print(f"wrote {cmf_path} ({os.path.getsize(cmf_path):,} bytes)", flush=True)
        if ref_logits:
            reference_logits(cmf_path, ref_logits)
            print(f"wrote {ref_logits}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # cortiq of this checkout
    sys.exit(main())
