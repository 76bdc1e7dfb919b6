"""`cortiq info MODEL` and `cortiq verify MODEL` (registered in src/cortiq/serve/cli.py),
for CMF and GGUF files (told apart by their magic).

MODEL is any model argument (`cortiq.serve.model_arg`): a checkpoint directory or Hub id
is described (or checked) as the CMF file it converts to in the cache.

User errors (missing or malformed file) print one line and return 1: never a traceback.
"""
from __future__ import annotations

import sys

from .model_arg import add_model_argument, model_path


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n}"


def _open(args, verify="lazy"):
    from ..runtime.model_file import open_model_file
    path = model_path(args)
    if path is None:                       # no file: the bundled demo model
        from ..demo import demo_path
        path = demo_path()
    return open_model_file(path, verify=verify)


def _fail(e) -> int:
    msg = str(e).replace("\n", " ") or type(e).__name__
    print(f"cortiq: error: {msg}", file=sys.stderr)
    return 1


def _precision_line(by_dtype: dict) -> str:
    """What the default precision in force (cortiq.get_precision()) does with these
    dtypes: the bytes whose products take int8 activations."""
    from ..kernels._config import get_precision
    from ..kernels.tensor import AUTO_I8_DTYPES, I8_DTYPES, prompt_int8_dtypes
    p = get_precision()
    takes = {"exact": (), "int8": I8_DTYPES, "auto": AUTO_I8_DTYPES}[p]
    total = sum(b for _, b in by_dtype.values()) or 1
    i8 = sum(b for d, (_, b) in by_dtype.items() if d in takes)
    dts = ", ".join(sorted(d for d in by_dtype if d in takes)) or "none"
    line = (f"precision:   {p} (LLM default; CORTIQ_PRECISION): int8 activations for "
            f"{100 * i8 / total:.0f} % of the weight bytes ({dts}), float32 for the rest")
    in_prompts = prompt_int8_dtypes()
    prompt = sorted(d for d in by_dtype if d in in_prompts and d not in takes)
    if p == "auto" and prompt:
        line += f"; in prompts int8 for {', '.join(prompt)} too (their decode stays exact)"
    return line


def cmd_info(args) -> int:
    try:
        cf = _open(args)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 -- one line, never a traceback
        return _fail(e)
    with cf:
        a = cf.arch
        gguf_file = getattr(cf, "layout", None) is not None
        piece = "split parts" if gguf_file else "shards"
        out = [f"file:        {cf.path}" + (f" ({len(cf.files)} {piece})"
                                            if len(cf.files) > 1 else "")]
        out.append(f"arch:        {a['arch_name']}  hidden {a['hidden_size']}, layers "
                   f"{a['num_layers']}, heads {a['num_attention_heads']}/{a['num_kv_heads']} "
                   f"(head_dim {a['head_dim']}), ffn {a['intermediate_size']}, vocab "
                   f"{a['vocab_size']}, ctx {a['max_position_embeddings']}")
        if cf.moe:
            m = cf.moe
            out.append(f"moe:         {m['num_experts']} experts, top {m['top_k']}, ffn "
                       f"{m['moe_intermediate_size']}")
        gguf = getattr(cf, "layout", None)          # a GgufFile's parsed container
        if gguf is not None:
            kinds = cf.ggml_type_counts()
            parts = f" in {len(cf.files)} split parts" if len(cf.files) > 1 else ""
            out.append(f"format:      GGUF v{gguf.version} ({cf.gguf_architecture}), "
                       f"{_fmt_bytes(cf.nbytes)}{parts}; ggml types: " + ", ".join(
                           f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])))
        else:
            out.append(f"quant_type:  {cf.quant_type}   features 0x{cf.features:x}")
        by: dict = {}
        for t in cf.tensors.values():
            c, b = by.get(t.dtype, (0, 0))
            by[t.dtype] = (c + 1, b + t.nbytes)
        total = sum(b for _, b in by.values())
        out.append(f"tensors:     {len(cf.tensors)}  ({_fmt_bytes(total)})")
        for d, (c, b) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            out.append(f"  {d:<10} {c:>6} tensors  {_fmt_bytes(b):>12}")
        out.append(_precision_line(by))
        n_tok = cf.sections()["vocab"][1]
        kind = "GGUF tokenizer metadata" if gguf is not None else "tokenizer.json"
        out.append(f"tokenizer:   {kind + ', ' + _fmt_bytes(n_tok) if n_tok else 'none'}")
        tc = cf.tokenizer_config
        if tc:
            tpl = tc.get("chat_template")
            out.append(f"chat:        template {len(tpl) if tpl else 0} chars, eos "
                       f"{tc.get('eos_token_ids', [])}, bos {tc.get('bos_token_id')}, pad "
                       f"{tc.get('pad_token_id')}")
        else:
            out.append("chat:        none (ChatML fallback)")
        sk = cf.skills
        out.append(f"skills:      {', '.join(s['id'] for s in sk) if sk else 'none'}")
        if cf.masks is not None:
            out.append(f"masks:       {len(cf.masks)} (default {cf.masks.default_task!r}): "
                       f"{', '.join(cf.masks.names())}")
        else:
            out.append("masks:       none")
        if len(cf.files) > 1 or cf.shard:
            for f in cf.files:
                n = sum(1 for t in cf.tensors.values() if t.file == f)
                out.append(f"{'part:' if gguf_file else 'shard:':<13}{f}  ({n} tensors)")
        print("\n".join(out))
    return 0


def cmd_verify(args) -> int:
    try:
        cf = _open(args, verify="off")      # verify() itself lists every problem
        with cf:
            problems = cf.verify()
            n = len(cf.tensors)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 -- one line, never a traceback
        return _fail(e)
    if problems:
        for p in problems:
            print(p)
        return 1
    if getattr(cf, "layout", None) is not None:
        print(f"ok: {n} tensors; GGUF structure checked (header, metadata, tensor types, "
              "shapes, alignment and extents). A GGUF file stores no hashes: its weights' "
              "bytes cannot be checked")
        return 0
    print(f"ok: {n} tensors, header, directory and section hashes match")
    return 0


def add_subcommands(sub) -> None:
    p = sub.add_parser("info", help="describe a CMF or GGUF file (architecture, dtypes, "
                                    "tokenizer, skills, masks, shards)")
    add_model_argument(p)
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("verify", help="check every hash of a CMF file (a GGUF file: its "
                                      "structure); exit 1 on problems")
    add_model_argument(p)
    p.set_defaults(func=cmd_verify)
