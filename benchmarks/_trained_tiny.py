"""Tiny Llama / Qwen3 / Mistral models that actually predict text, trained here offline.

A random model's next-token distribution is nearly flat, so two engines that round
activations differently flip its near-ties and a greedy-agreement number says little.
These models are trained briefly (a fixed number of steps, fixed seeds (``SEEDS``), one thread,
``nice``) with torch + transformers on Python's own standard library sources (the
top-level ``*.py`` files of the running interpreter: every tenth file, in sorted order,
is held out for evaluation and never trained on), with a byte-level BPE vocabulary
trained by ``tokenizers`` on the same files. The three share the corpus, the tokenizer
and the geometry (hidden 256 so every matrix row is whole 256-value K-quant
super-blocks, 4 layers, 4 heads x 64 with 2 KV heads, MLP 768); they differ in what
their family adds: Qwen3's q/k norms, Mistral's sliding window (4096, longer than any
context the benchmark uses, so the window never drops a key: llama.cpp runs a Mistral
GGUF as plain ``llama``).

``trained(family, cache)`` returns the directory of the saved HF checkpoint (weights,
``config.json``, ``tokenizer.json``), training it on the first call;
``write_f16_gguf(hf_dir, path)`` writes it as an F16 GGUF the way llama.cpp's converter
lays it out (``tests/reference/gguf_llama.py``); ``held_out_ids(cache, n, count)`` gives
token windows of the held-out files. Everything written appears atomically.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GEOMETRY = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, intermediate_size=768,
                max_position_embeddings=2048, rms_norm_eps=1e-5,
                rope_theta=10000.0, tie_word_embeddings=False)
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM", {}),
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
            "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4096})}
#: initialisation and batch-order seeds: with a window no context here reaches, the
#: Mistral is a Llama, so it starts from another seed to be a different model
SEEDS = {"llama": 0, "qwen3": 0, "mistral": 1}
VOCAB = 2048
#: the training recipe; part of the cache key, so a change retrains
RECIPE = dict(steps=200, batch=8, seq=128, lr=3e-3, warmup=20, weight_decay=0.01,
              corpus_bytes=3_000_000)
SPECIALS = ["<|endoftext|>"]


def _files() -> tuple[list[str], list[str]]:
    """(training files, held-out files) of the standard library, in sorted order."""
    fs = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    return ([f for i, f in enumerate(fs) if i % 10], [f for i, f in enumerate(fs)
                                                      if i % 10 == 0])


def _read(files, limit=None) -> str:
    parts, n = [], 0
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            t = fh.read()
        parts.append(t)
        n += len(t)
        if limit is not None and n >= limit:
            break
    return "<|endoftext|>".join(parts)


def _key() -> str:
    h = hashlib.sha256(json.dumps([GEOMETRY, RECIPE, VOCAB, SEEDS, sys.version]).encode())
    return h.hexdigest()[:12]


def _atomic_dir(final, build):
    """Build a directory with `build(tmp)` and rename it into place."""
    if os.path.isdir(final):
        return final
    tmp = f"{final}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    build(tmp)
    try:
        os.rename(tmp, final)
    except OSError:                      # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def tokenizer(cache):
    """The shared byte-level BPE (``tokenizers.Tokenizer``), trained on the first call."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def build(tmp):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                 show_progress=False)
        tok.train_from_iterator([_read(_files()[0], RECIPE["corpus_bytes"])], tr)
        tok.save(os.path.join(tmp, "tokenizer.json"))
    d = _atomic_dir(os.path.join(cache, f"tokenizer-{_key()}"), build)
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def held_out_ids(cache, n: int, count: int) -> list[list[int]]:
    """`count` windows of `n` tokens, one from the start of each of the first held-out
    files long enough (past their first 200 characters: the licence boilerplate)."""
    tok = tokenizer(cache)
    out = []
    for f in _files()[1]:
        ids = tok.encode(_read([f])[200:]).ids
        if len(ids) >= n:
            out.append(ids[:n])
        if len(out) == count:
            break
    return out


def _config(family):
    import transformers
    cls, _, extra = FAMILIES[family]
    return getattr(transformers, cls)(vocab_size=VOCAB, bos_token_id=None,
                                      eos_token_id=0, pad_token_id=None,
                                      **GEOMETRY, **extra)


def _train(family, cache, tmp, log):
    import torch
    import transformers
    torch.set_num_threads(1)
    torch.manual_seed(SEEDS[family])
    ids = np.asarray(tokenizer(cache).encode(_read(_files()[0], RECIPE["corpus_bytes"])).ids,
                     np.int64)
    model = getattr(transformers, FAMILIES[family][1])(_config(family)).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=RECIPE["lr"],
                            weight_decay=RECIPE["weight_decay"], betas=(0.9, 0.95))
    steps, warm = RECIPE["steps"], RECIPE["warmup"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * (
        0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(1.0, s / steps)))))
    rng = np.random.default_rng(SEEDS[family])
    seq, batch = RECIPE["seq"], RECIPE["batch"]
    t0, losses = time.perf_counter(), []
    for step in range(steps):
        starts = rng.integers(0, len(ids) - seq - 1, batch)
        x = torch.from_numpy(np.stack([ids[s:s + seq + 1] for s in starts]))
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1].clone()).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log and (step % 50 == 0 or step == steps - 1):
            print(f"  {family} step {step}: loss {np.mean(losses[-50:]):.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    model.eval()
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.copyfile(os.path.join(cache, f"tokenizer-{_key()}", "tokenizer.json"),
                    os.path.join(tmp, "tokenizer.json"))
    with open(os.path.join(tmp, "training.json"), "w") as f:
        json.dump(dict(recipe=RECIPE, geometry=GEOMETRY, vocab=VOCAB, family=family,
                       seed=SEEDS[family],
                       final_loss=float(np.mean(losses[-20:])),
                       seconds=time.perf_counter() - t0,
                       train_tokens=len(ids)), f, indent=1)


def trained(family: str, cache: str, log: bool = True) -> str:
    """The directory of the trained `family` checkpoint under `cache`."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    os.makedirs(cache, exist_ok=True)
    tokenizer(cache)
    return _atomic_dir(os.path.join(cache, f"{family}-{_key()}"),
                       lambda tmp: _train(family, cache, tmp, log))


def load(hf_dir):
    """The saved checkpoint as a float32 transformers model in eval mode."""
    import transformers
    with open(os.path.join(hf_dir, "training.json")) as f:
        family = json.load(f)["family"]
    cls = getattr(transformers, FAMILIES[family][1])
    return cls.from_pretrained(hf_dir, torch_dtype="float32").eval()


def write_f16_gguf(hf_dir, path) -> None:
    """The checkpoint as an F16 GGUF (norms F32), written atomically."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import gguf
    from reference import gguf_llama  # the tests' GGUF writer

    from cortiq.convert import hf_llama
    with open(os.path.join(hf_dir, "config.json")) as f:
        arch = hf_llama.arch_from_hf_config(json.load(f))
    model = load(hf_dir)
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()
             if not k.endswith("inv_freq")}
    with open(os.path.join(hf_dir, "tokenizer.json")) as f:
        tokens, types, merges = gguf_llama.gpt2_vocab(f.read(), VOCAB)
    spec = {"model": "gpt2", "pre": "gpt-2", "tokens": tokens, "types": types,
            "merges": merges, "eos": 0, "add_bos": False}
    T = gguf.GGMLQuantizationType
    tmp = f"{path}.tmp-{os.getpid()}"
    gguf_llama.write(tmp, state, arch, types=lambda n, a: T.F16 if a.ndim == 2 else T.F32,
                     tokenizer=spec)
    os.replace(tmp, path)
