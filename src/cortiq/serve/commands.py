"""`cortiq run | chat | embed | convert | import-gguf | bench | serve` (in src/cortiq/serve/cli.py).

User errors (bad file, bad option value, a missing extra) raise CortiqError / OSError;
cortiq.serve.cli.main prints them as one line and exits 1.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from ..errors import ConfigError
from .model_arg import add_model_argument, model_path


def _add_model_options(p):
    add_model_argument(p)
    p.add_argument("--threads", type=int, default=None, help="kernel threads")
    p.add_argument("--skill", default=None,
                   help="skill id, 'auto', or a blend 'a=0.7,b=0.3'")
    p.add_argument("--task", default=None, help="mask task for MoE expert routing")
    p.add_argument("--n-ctx", type=int, default=None, help="context size cap (tokens)")
    p.add_argument("--preload", action=argparse.BooleanOptionalAction, default=None,
                   help="copy the weights into anonymous huge-page memory at load (faster "
                        "decode, no page-cache sharing); default: CORTIQ_PRELOAD, else off "
                        "(serve: on)")
    p.add_argument("--device", choices=("cpu", "gpu", "auto"), default=None,
                   help="where the model runs (default: CORTIQ_DEVICE, else cpu; docs/gpu.md)")
    p.add_argument("--precision", choices=("exact", "int8", "auto"), default=None,
                   help="activations of the matrix products: exact float32, int8 "
                        "(integer products), auto (int8 for 4-bit-and-below weights, and "
                        "for q8 weights in prompts; decode exact for q8); "
                        "default: CORTIQ_PRECISION, else auto")
    p.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help="concurrent generations that share one forward (continuous "
                        "batching; 1: each on its own); default 8 (serve: "
                        "--max-concurrency)")


def _add_sampling_options(p):
    p.add_argument("-n", "--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repetition-penalty", "--rep-penalty", type=float, default=None)
    p.add_argument("--presence-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--greedy", action="store_true",
                   help="argmax decoding (temperature 0, repetition penalty 1)")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--no-think", action="store_true",
                   help="render the chat template with enable_thinking=false")


def _skill(spec):
    if spec is None or "=" not in spec:
        return spec
    out = {}
    for part in spec.split(","):
        k, _, w = part.partition("=")
        try:
            out[k.strip()] = float(w)
        except ValueError:
            raise ConfigError(f"--skill: blend weight {w!r} of {k!r} is not a number") from None
    return out


def _open(args, **kw):
    from ..runtime.llm import LLM
    if getattr(args, "max_batch", None) is not None:
        kw.setdefault("max_batch", args.max_batch)
    return LLM(model_path(args), n_threads=args.threads, skill=_skill(args.skill), task=args.task,
               n_ctx=args.n_ctx, preload=args.preload, precision=args.precision,
               device=args.device, **kw)


def _sampling(args, llm) -> dict:
    """`cortiq run/chat` sample with cortiq's defaults (SamplingParams', which keep a small
    model's text coherent), the model's own generation defaults over them where its file
    has them, and the flags over both (the server takes OpenAI's defaults instead)."""
    from ..runtime.sampling import SamplingParams
    kw = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
              min_p=args.min_p, repetition_penalty=args.repetition_penalty,
              presence_penalty=args.presence_penalty, seed=args.seed)
    if args.greedy:
        kw.update(temperature=0.0, repetition_penalty=1.0)
    base = SamplingParams(seed=llm.seed, **llm.generation_defaults)
    return {"sampling": base, **{k: v for k, v in kw.items() if v is not None}}


_FIELD_PREFIX = re.compile(r"^(?:SamplingParams\.)?([a-z_]+): ")


def _check_sampling_flags(args) -> None:
    """Refuse a bad sampling flag before the model loads, the message naming the flag
    (`--top-p: must be in [0, 1]`) rather than the SamplingParams field it sets."""
    from ..runtime.llm import LLM
    from ..runtime.sampling import SamplingParams
    given = {k: getattr(args, k) for k in ("temperature", "top_p", "top_k", "min_p",
                                           "repetition_penalty", "presence_penalty", "seed")}
    try:
        SamplingParams(**{k: v for k, v in given.items() if v is not None})
        LLM._max_tokens(args.max_tokens)
    except ConfigError as e:
        raise ConfigError(_FIELD_PREFIX.sub(
            lambda m: f"--{m.group(1).replace('_', '-')}: ", str(e), count=1)) from None


def _chat_mode(llm, args) -> bool:
    return not args.raw and not llm.chat_template.is_fallback


def _print_stream(chunks, key):
    out = []
    for c in chunks:
        piece = key(c)
        if piece:
            out.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
    return "".join(out)


def _read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror or e}") from None


def _structured_options(args, chat: bool) -> dict:
    """--json / --json-schema / --grammar / --logprobs as create_* keywords."""
    kw: dict = {}
    if args.json_schema is not None:
        text = _read_text(args.json_schema, "--json-schema")
        try:
            schema = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"--json-schema {args.json_schema}: not valid JSON: {e}") from None
        kw["response_format"] = {"type": "json_schema",
                                 "json_schema": {"name": "output", "schema": schema}}
    elif args.json:
        kw["response_format"] = {"type": "json_object"}
    if args.grammar is not None:
        if kw:
            raise ConfigError("--grammar: give one of --grammar, --json, --json-schema")
        kw["grammar"] = _read_text(args.grammar, "--grammar")
    if args.logprobs is not None:
        if chat:
            kw.update(logprobs=True, top_logprobs=args.logprobs)
        else:
            kw["logprobs"] = args.logprobs
    return kw


def _print_logprobs(r, chat: bool) -> None:
    """Each generated token with its log-probability and the top alternatives (stderr)."""
    lp = r["choices"][0]["logprobs"]
    if lp is None:
        return
    if chat:
        rows = [(e["token"], e["logprob"], [(t["token"], t["logprob"])
                                            for t in e["top_logprobs"]])
                for e in lp["content"]]
    else:
        rows = [(t, p, list((top or {}).items()))
                for t, p, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])]
    for tok, p, top in rows:
        alts = "  ".join(f"{a!r} {q:.3f}" for a, q in top)
        print(f"{tok!r}\t{p:.4f}\t{alts}" if p is not None else f"{tok!r}\t-", file=sys.stderr)


def cmd_run(args) -> int:
    if args.prompt is None:
        if args.json or args.json_schema or args.grammar or args.logprobs is not None:
            raise ConfigError("--json, --json-schema, --grammar and --logprobs need --prompt")
        return cmd_chat(args)
    _check_sampling_flags(args)
    with _open(args) as llm:
        chat = _chat_mode(llm, args)
        samp = {**_sampling(args, llm), **_structured_options(args, chat)}
        if args.stream and args.logprobs is not None:
            raise ConfigError("--logprobs: not with --stream")
        think = False if args.no_think else None
        t0 = time.perf_counter()
        if chat:
            msgs = [{"role": "user", "content": args.prompt}]
            if args.stream:
                chunks = llm.create_chat_completion(
                    msgs, max_tokens=args.max_tokens, stop=args.stop, stream=True,
                    enable_thinking=think, stream_options={"include_usage": True}, **samp)
                usage = {}

                def key(c):
                    if c.get("usage"):
                        usage.update(c["usage"])
                    return c["choices"][0]["delta"].get("content") if c["choices"] else None
                _print_stream(chunks, key)
                sys.stdout.write("\n")
            else:
                r = llm.create_chat_completion(msgs, max_tokens=args.max_tokens, stop=args.stop,
                                               enable_thinking=think, **samp)
                print(r["choices"][0]["message"]["content"])
                _print_logprobs(r, True)
                usage = r["usage"]
        else:
            if args.stream:
                usage = {}

                def key(c):
                    if c.get("usage"):
                        usage.update(c["usage"])
                    return c["choices"][0]["text"]
                _print_stream(llm.create_completion(args.prompt, max_tokens=args.max_tokens,
                                                    stop=args.stop, stream=True, **samp), key)
                sys.stdout.write("\n")
            else:
                r = llm.create_completion(args.prompt, max_tokens=args.max_tokens,
                                          stop=args.stop, **samp)
                print(r["choices"][0]["text"])
                _print_logprobs(r, False)
                usage = r["usage"]
        if args.stats:
            dt = time.perf_counter() - t0
            print(f"[{usage.get('prompt_tokens')} prompt + {usage.get('completion_tokens')} "
                  f"generated tokens in {dt:.2f} s]", file=sys.stderr)
    return 0


def cmd_embed(args) -> int:
    texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise ConfigError("embed: no texts (give them as arguments or on stdin)")
    with _open(args) as llm:
        for v in llm.embed(texts, pooling=args.pooling):
            print(json.dumps([round(float(x), 7) for x in v]))
    return 0


def _fit_history(llm, history, first) -> None:
    """Upstream's rule: while the rendered conversation is over half the context, drop
    the oldest exchange after the system message (never the turn being asked)."""
    while len(history) - first > 1:
        n = len(llm.tokenize(llm.apply_chat_template(history)))
        if n <= llm.n_ctx // 2:
            return
        del history[first:first + 2]
        print("[dropped the oldest exchange to fit the context]", file=sys.stderr)


def cmd_chat(args) -> int:
    """Interactive multi-turn chat on one session: each turn re-renders the history and
    re-reads only what follows the longest common prefix. /reset clears, /exit quits."""
    _check_sampling_flags(args)
    with _open(args, max_sessions=0) as llm:
        samp = _sampling(args, llm)
        think = False if args.no_think else None
        session = llm.session()
        system = getattr(args, "system", None)
        history = [{"role": "system", "content": system}] if system else []
        interactive = sys.stdin.isatty()
        while True:
            if interactive:
                sys.stdout.write("> ")
                sys.stdout.flush()
            line = sys.stdin.readline()
            if not line:
                break
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if line.strip() in ("/exit", "/quit"):
                break
            if line.strip() == "/reset":
                history = history[:1] if system else []
                session.reset()
                continue
            history.append({"role": "user", "content": line})
            _fit_history(llm, history, 1 if system else 0)
            t0 = time.perf_counter()
            usage: dict = {}

            def key(c, usage=usage):
                if c.get("usage"):
                    usage.update(c["usage"])
                return c["choices"][0]["delta"].get("content") if c["choices"] else None
            text = _print_stream(llm.create_chat_completion(
                history, max_tokens=args.max_tokens, stop=args.stop, stream=True,
                session=session, enable_thinking=think,
                stream_options={"include_usage": True}, **samp), key)
            sys.stdout.write("\n")
            sys.stdout.flush()
            history.append({"role": "assistant", "content": text})
            if args.stats:
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                print(f"[prompt {usage['prompt_tokens']} tokens, {cached} reused, "
                      f"{usage['prompt_tokens'] - cached} read; {usage['completion_tokens']} "
                      f"generated; {time.perf_counter() - t0:.2f} s]", file=sys.stderr)
    return 0


def _magic(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(4)
    except OSError:
        return b""


def _check_convert_source(path: str) -> None:
    """`cortiq convert` reads a checkpoint directory: a model file given instead is told
    which command takes it."""
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if ggufs:
            raise ConfigError(f"{path}: no config.json, but GGUF files ({', '.join(ggufs[:4])}"
                              f"{', ...' if len(ggufs) > 4 else ''}); cortiq convert reads "
                              f"Hugging Face checkpoint directories: run a GGUF as it is "
                              f"(cortiq run {path}) or convert it with cortiq import-gguf")
    if not os.path.isfile(path):
        return                           # a directory (or nothing): the converter says
    magic = _magic(path)
    if magic == b"GGUF":
        raise ConfigError(f"{path}: a GGUF file; cortiq convert reads Hugging Face "
                          f"checkpoint directories. Run it as it is (cortiq run {path}) or "
                          f"convert it with cortiq import-gguf {path} OUT.cmf")
    if magic == b"CMF\x01":
        raise ConfigError(f"{path}: already a CMF file (cortiq info {path} describes it)")
    raise ConfigError(f"{path}: a file; cortiq convert reads a checkpoint directory: pass "
                      f"the directory holding config.json and the *.safetensors weights "
                      f"({os.path.dirname(os.path.abspath(path))})")


def _check_gguf_source(path: str) -> None:
    """`cortiq import-gguf` reads a GGUF file: anything else is told which command fits."""
    if os.path.isdir(path):
        raise ConfigError(f"{path}: a directory; cortiq import-gguf needs a .gguf file "
                          f"(a Hugging Face checkpoint directory converts with cortiq "
                          f"convert {path} OUT.cmf)")
    if not os.path.exists(path):
        raise ConfigError(f"{path}: no such file")
    magic = _magic(path)
    if magic == b"CMF\x01":
        raise ConfigError(f"{path}: already a CMF file; cortiq import-gguf needs a .gguf file")
    if magic != b"GGUF":
        raise ConfigError(f"{path}: not a GGUF file (it starts {magic!r}); cortiq "
                          "import-gguf needs a .gguf file (a checkpoint directory converts "
                          "with cortiq convert DIR OUT.cmf)")


def cmd_convert(args) -> int:
    from ..cmf.writer import QUANT_LABEL
    _check_convert_source(args.hf_dir)
    if args.quant not in QUANT_LABEL:
        raise ConfigError(f"--quant {args.quant!r}: expected one of {', '.join(QUANT_LABEL)}")
    eq = getattr(args, "experts_quant", None)
    try:
        from ..convert import convert_as, from_hf
        if args.arch == "auto":
            from_hf(args.hf_dir, args.out, quant=args.quant, progress=not args.quiet,
                    experts_quant=eq)
        else:
            convert_as(args.arch, args.hf_dir, args.out, quant=args.quant,
                       progress=not args.quiet, experts_quant=eq)
    except ImportError as e:
        raise ConfigError(f"cortiq convert needs the 'convert' extra (pip install "
                          f"'cortiq[convert]'): {e}") from None
    if not args.quiet:
        print(f"wrote {args.out}")
    return 0


def _gguf_source(text: str, progress: bool | None) -> str:
    """The local GGUF file `cortiq import-gguf` reads: the path itself, the one model of
    a folder without a config.json, or a Hub id's GGUF (org/name:QUANT, downloaded into
    the cache, every part of a split set)."""
    from ..pretrained import model_in_folder, progress_default
    if os.path.isdir(text) and not os.path.isfile(os.path.join(text, "config.json")):
        return str(model_in_folder(Path(text)))
    if not os.path.exists(text):
        from ..hub import fetch, parse_hub_id
        hub_id = parse_hub_id(text)
        if hub_id is not None:
            return str(fetch(hub_id[0], hub_id[1], progress=progress_default(progress)))
    return text


def cmd_import_gguf(args) -> int:
    src = _gguf_source(args.gguf, False if args.quiet else None)
    _check_gguf_source(src)
    from ..convert.gguf_import import import_gguf
    import_gguf(src, args.out, quant=args.quant, progress=not args.quiet)
    if not args.quiet:
        print(f"wrote {args.out}")
    return 0


def cmd_bench(args) -> int:
    """Prefill and decode speed, and the saving of a chat turn that reuses its session."""
    import numpy as np
    with _open(args) as llm:
        rng = np.random.default_rng(0)
        n_prompt = min(args.prompt_tokens, llm.n_ctx - args.tokens - 1)
        ids = rng.integers(0, llm.vocab_size, n_prompt).tolist()
        res = {"precision": llm.precision_in_force}
        s = llm.session()
        t0 = time.perf_counter()
        s.feed(ids, want="last")
        t1 = time.perf_counter()
        res["prefill_tokens"] = n_prompt
        res["prefill_tok_s"] = n_prompt / (t1 - t0)
        tok = int(np.argmax(s.logits()))
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            tok = int(np.argmax(s.feed([tok], want="last")))
        t1 = time.perf_counter()
        res["decode_tokens"] = args.tokens
        res["decode_tok_s"] = args.tokens / (t1 - t0)
        # A chat turn: the held sequence plus `turn` new tokens, reused vs from scratch.
        turn = rng.integers(0, llm.vocab_size, args.turn_tokens).tolist()
        seq = s.ids + turn
        t0 = time.perf_counter()
        reused, _ = s.prefill(seq)
        t_reuse = time.perf_counter() - t0
        t0 = time.perf_counter()
        llm.session().prefill(seq)
        t_fresh = time.perf_counter() - t0
        res.update(turn_tokens=len(seq), turn_reused_tokens=reused, turn_reuse_s=t_reuse,
                   turn_fresh_s=t_fresh, turn_speedup=t_fresh / t_reuse)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"precision {res['precision']}")
        print(f"prefill  {res['prefill_tokens']:6d} tokens  {res['prefill_tok_s']:10.1f} tok/s")
        print(f"decode   {res['decode_tokens']:6d} tokens  {res['decode_tok_s']:10.1f} tok/s")
        print(f"chat turn of {res['turn_tokens']} tokens: reusing {reused} held tokens "
              f"{t_reuse * 1e3:.1f} ms vs fresh {t_fresh * 1e3:.1f} ms "
              f"(x{res['turn_speedup']:.1f})")
    return 0


def cmd_serve(args) -> int:
    if args.ray:
        return _serve_ray(args)
    for flag, given in (("--replicas", args.replicas), ("--autoscale", args.autoscale),
                        ("--threads-per-replica", args.threads_per_replica),
                        ("--ray-address", args.ray_address), ("--verify", args.verify or None)):
        if given is not None:
            raise ConfigError(f"{flag} needs --ray")
    from . import serve  # looked up when called, so a test can patch cortiq.serve.serve
    if args.preload is None:  # a server loads once and decodes for long: copy by default
        from ..kernels._config import preload_default
        args.preload = preload_default(long_running=True)
    # the generations the server runs at once are the batch the scheduler forms
    batch = args.max_batch if args.max_batch is not None else max(args.max_concurrency, 1)
    access = _access_options(args)       # bad flags refused before the model loads
    llm = _open(args, seed=args.seed, max_sessions=args.max_sessions, max_batch=batch)
    try:
        cut = serve(llm, args.host, args.port, max_concurrency=args.max_concurrency,
                    max_queue=args.max_queue, graceful_timeout=args.graceful_timeout,
                    max_prompt_tokens=args.max_prompt_tokens,
                    log_level=args.log_level, **access)
    finally:
        llm.close()
    if cut:
        print(f"cortiq: shutdown cut {cut} running request(s) after the "
              f"{args.graceful_timeout:g} s grace period", file=sys.stderr)
        return 1
    return 0


def _comma_list(values, flag: str) -> list[str] | None:
    """A repeatable, comma-separated flag's values as one list (None: not given)."""
    if values is None:
        return None
    items = [v.strip() for value in values for v in value.split(",")]
    if not all(items):
        raise ConfigError(f"{flag}: an empty item in {','.join(values)!r}")
    return items


def _access_options(args) -> dict:
    """create_app's access options from the serve flags: keys (flags, file, then
    CORTIQ_API_KEY), served names, CORS."""
    from ..kernels._config import api_keys_from_env
    from .auth import read_key_file
    keys = list(args.api_key or [])
    if any(not k.strip() for k in keys):
        raise ConfigError("--api-key: an empty key")
    if args.api_key_file is not None:
        keys += read_key_file(args.api_key_file)
    keys += api_keys_from_env()
    names = args.served_model_name
    if names is not None and any(not n.strip() for n in names):
        raise ConfigError("--served-model-name: an empty name")
    origins = _comma_list(args.cors_origins, "--cors-origins")
    methods = _comma_list(args.cors_methods, "--cors-methods")
    headers = _comma_list(args.cors_headers, "--cors-headers")
    if (methods or headers) and not origins:
        raise ConfigError("--cors-methods and --cors-headers need --cors-origins")
    return {"api_keys": keys, "metrics_auth": args.metrics_auth, "model_name": names,
            "cors_origins": origins, "cors_methods": methods, "cors_headers": headers}


def _serve_ray(args) -> int:
    """`cortiq serve MODEL --ray`: replicas on a Ray cluster (cortiq.ray)."""
    try:
        import cortiq.serve.ray as cray
    except ImportError as e:
        raise ConfigError(str(e)) from None
    if args.threads is not None and args.threads_per_replica is not None:
        raise ConfigError("give --threads-per-replica (or --threads), not both")
    # the replicas open the resolved local file (downloaded or converted here, once):
    # every host must see it at that path (docs/scaling.md)
    model = model_path(args)
    if args.ray_address is None and model is not None:
        from ..runtime.model_file import open_model_file  # local: the file must open here
        open_model_file(model).close()
    preload = args.preload
    if preload is None:  # replicas on one host share the mapped file's page cache
        from ..kernels._config import preload_default
        preload = bool(preload_default())
    app = cray.deployment(
        model, replicas=args.replicas, autoscale=args.autoscale,
        threads_per_replica=next((t for t in (args.threads_per_replica, args.threads)
                                  if t is not None), 1),
        verify=args.verify, max_concurrency=args.max_concurrency, max_queue=args.max_queue,
        graceful_timeout=args.graceful_timeout, seed=args.seed, skill=_skill(args.skill),
        task=args.task, n_ctx=args.n_ctx, max_sessions=args.max_sessions, preload=preload,
        max_prompt_tokens=args.max_prompt_tokens, **_access_options(args))
    cray.serve_until_stopped(app, address=args.ray_address, host=args.host, port=args.port,
                             log_level=args.log_level)
    return 0


def add_subcommands(sub) -> None:
    from ..gguf.llama_meta import architectures as gguf_architectures
    from ..models import converter_names
    r = sub.add_parser("run", help="generate from a prompt (no --prompt: interactive chat)")
    _add_model_options(r)
    r.add_argument("-p", "--prompt", default=None)
    _add_sampling_options(r)
    r.add_argument("--stream", action="store_true", help="print tokens as they come")
    r.add_argument("--raw", action="store_true", help="no chat template: plain continuation")
    r.add_argument("--stats", action="store_true", help="token counts and time on stderr")
    r.add_argument("--system", default=None, help="system message (chat)")
    r.add_argument("--json", action="store_true", help="output one JSON object (constrained)")
    r.add_argument("--json-schema", default=None, metavar="FILE",
                   help="output JSON valid against the JSON schema in FILE (constrained)")
    r.add_argument("--grammar", default=None, metavar="FILE",
                   help="output matching the GBNF or Lark grammar in FILE (constrained)")
    r.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="print each token's log-probability and its N best alternatives "
                        "(stderr)")
    r.set_defaults(func=cmd_run)

    e = sub.add_parser("embed", help="embeddings of texts (one JSON array per line)")
    _add_model_options(e)
    e.add_argument("-t", "--text", action="append", dest="texts", default=None,
                   metavar="TEXT", help="a text to embed (repeatable; none: one per stdin line)")
    e.add_argument("--pooling", choices=("mean", "last"), default="mean")
    e.set_defaults(func=cmd_embed)

    c = sub.add_parser("chat", help="interactive multi-turn chat (reuses the KV state)")
    _add_model_options(c)
    _add_sampling_options(c)
    c.add_argument("--system", default=None, help="system message")
    c.add_argument("--stats", action="store_true",
                   help="per turn: prompt tokens reused/read, generated, time (stderr)")
    c.set_defaults(func=cmd_chat, raw=False)

    v = sub.add_parser("convert", help="convert a Hugging Face checkpoint to CMF")
    v.add_argument("hf_dir", metavar="HF_DIR")
    v.add_argument("out", metavar="OUT.cmf")
    v.add_argument("--arch", default="auto",
                   help=f"{', '.join(converter_names())}, or auto (from config.json)")
    v.add_argument("--quant", default="q8_row")
    v.add_argument("--experts-quant", default=None, metavar="DTYPE[,DOWN]",
                   help="dtype of the routed MoE experts (default: --quant), e.g. q4tp, "
                        "or q2tp,q4tp for 2-bit gate/up and 4-bit down")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.set_defaults(func=cmd_convert)

    g = sub.add_parser("import-gguf", help=f"convert a {'/'.join(gguf_architectures())} "
                                           "GGUF file to CMF, every tensor's bytes kept")
    g.add_argument("gguf", metavar="FILE.gguf",
                   help="a .gguf file (any part of a split one), a folder holding one, or "
                        "a Hub id org/name:QUANT")
    g.add_argument("out", metavar="OUT.cmf")
    g.add_argument("--quant", default=None,
                   help="re-quantize every matrix to this CMF quant (f32: exact values); "
                        "default: the nearest layout per tensor (Q4_0 stays exact)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.set_defaults(func=cmd_import_gguf)

    b = sub.add_parser("bench", help="prefill/decode tokens per second, chat-turn reuse")
    _add_model_options(b)
    b.add_argument("--tokens", type=int, default=32, help="decode tokens")
    b.add_argument("--prompt-tokens", type=int, default=128)
    b.add_argument("--turn-tokens", type=int, default=16, help="new tokens of the chat turn")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    _add_model_options(s)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--seed", type=int, default=None, help="default sampling seed")
    s.add_argument("--max-concurrency", type=int, default=8,
                   help="generations at once (batched into one forward per step)")
    s.add_argument("--max-queue", type=int, default=8, help="requests waiting (then 429)")
    s.add_argument("--max-sessions", type=int, default=8, help="idle KV sessions kept")
    s.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="longest prompt accepted (default: the context size - 1)")
    s.add_argument("--graceful-timeout", type=float, default=30.0)
    s.add_argument("--log-level", default="warning")
    a = s.add_argument_group("access (README: production flags)")
    a.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/ routes (repeatable; "
                        "also CORTIQ_API_KEY, comma-separated)")
    a.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="accepted keys, one a line")
    a.add_argument("--metrics-auth", action="store_true",
                   help="/metrics needs a key too (health routes stay open)")
    a.add_argument("--served-model-name", action="append", default=None, metavar="NAME",
                   help="the model id /v1/models lists (repeatable: later names are "
                        "aliases; default: the model's name)")
    a.add_argument("--cors-origins", action="append", default=None, metavar="ORIGINS",
                   help="allow browser requests from these origins (comma-separated or "
                        "repeatable; '*': any); CORS is off without it")
    a.add_argument("--cors-methods", action="append", default=None, metavar="METHODS",
                   help="CORS methods allowed (default GET,POST)")
    a.add_argument("--cors-headers", action="append", default=None, metavar="HEADERS",
                   help="CORS request headers allowed (default Authorization,Content-Type)")
    g = s.add_argument_group("Ray Serve (the ray extra; docs/scaling.md)")
    g.add_argument("--ray", action="store_true",
                   help="serve replicas on a Ray cluster behind one endpoint (default "
                        "--preload: off, so replicas on a host share the page cache)")
    n = g.add_mutually_exclusive_group()
    n.add_argument("--replicas", type=int, default=None, help="replica count (default 1)")
    n.add_argument("--autoscale", metavar="MIN:MAX", default=None,
                   help="scale the replica count on ongoing requests")
    g.add_argument("--threads-per-replica", type=int, default=None,
                   help="kernel threads (and Ray CPUs) per replica (default: --threads, else 1)")
    g.add_argument("--ray-address", default=None,
                   help="connect to this Ray cluster ('auto', HOST:PORT, ray://...) instead "
                        "of starting a local one")
    g.add_argument("--verify", action="store_true",
                   help="check every hash of the model file at each replica's start")
    s.set_defaults(func=cmd_serve)
