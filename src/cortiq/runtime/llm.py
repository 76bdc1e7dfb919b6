"""`cortiq.LLM`: open a CMF model once, generate text from many sessions and threads.

    llm = cortiq.LLM("model.cmf")
    llm.generate("Once upon a time", max_tokens=32, temperature=0)
    llm.create_chat_completion([{"role": "user", "content": "Hi"}], stream=True)

One model object (its weights mmapped once, or with preload=True copied once into
anonymous huge-page memory) serves every session; a session is one sequence's KV
state. Generation (docs/runtime.md §3):

* prefill: a session already holding a prefix of the new prompt keeps it (rolls back
  to the longest common prefix) and runs only the rest -- the cross-turn KV reuse that
  makes a chat turn cost its new tokens, not the whole history. `LLM` keeps a small
  pool of idle sessions (`max_sessions`) and hands each call the one sharing the
  longest prefix with its prompt, so repeated chat turns through `create_chat_completion`
  (and the server) reuse their KV state without the caller managing sessions; pass
  `session=` to use one explicitly. `usage.prompt_tokens_details.cached_tokens` reports
  how many prompt tokens were not re-read.
* decode: sample with `cortiq.runtime.sampling.Sampler` over every id so far; stop on any of
  the tokenizer's EOS ids (finish_reason "stop"), on a stop string -- matched on the
  text, also across tokens, and cut out of the output (`cortiq.runtime.stopping`) -- or at
  `max_tokens` / the context size (finish_reason "length").
* Thread safety: calls from many Python threads run concurrently (each on its own
  session; the kernels release the GIL) and give exactly what serial calls give.

Skills (docs/cmf-format.md §11): `skill="sql"` loads `skill.sql.*` replacements, a mapping
`{"a": 0.7, "b": 0.3}` blends them, `skill="auto"` picks per prompt by the registry's
selection subspaces (see `cortiq.models.overlay`). φ, the routing feature, is the
prompt's mean input embedding. `task="coding"` is passed to models whose constructor
takes `task` (MoE expert masks); other models raise ConfigError naming the option.

`LLM` calls its models only through the model protocol (`cortiq.models.base`); a model
a user supplies (`LLM.from_model`, a class given to `cortiq.models.register`) is
checked against it once (`check_model`) when it is handed over or built.
"""
from __future__ import annotations

import inspect
import os
import threading
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from typing import cast

import numpy as np

from .. import cmf as _cmf
from ..kernels._config import check_precision, get_precision, preload_default, set_num_threads
from .batch import feed_batch as _feed_batch
from .chained import can_chain, chained_pieces
from ..text.chat import ChatTemplate, openai_messages
from ..errors import ConfigError, FormatError
from .generation import Generation, Options, Result, TokenLogprob, check_finite, log_softmax
from ..models.base import check_model
from .sampling import OPENAI_DEFAULTS, SamplingParams, model_defaults
from .scheduler import Request, Scheduler
from .session import Session
from .stopping import normalize_stop
from ..text.tokenizer import Tokenizer
from ..types import ChatCompletion, ChatCompletionChunk, Completion, EmbeddingList

__all__ = ["LLM"]

DEFAULT_MAX_TOKENS = 256          # upstream's `run -n` default
DEFAULT_MAX_CTX = 32768           # upstream's max_seq_len cap (CMF_MAX_SEQ default)
DEFAULT_MAX_BATCH = 8             # concurrent generations that share one forward
_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "logit_bias", "suppress_tokens",
                  "seed")


# other libraries' names for a sampling keyword -> cortiq's (llama-cpp-python's)
_SAMPLING_ALIASES = {"repeat_penalty": "repetition_penalty"}


def _resolve_aliases(kw: dict) -> dict:
    """`kw` with each alias renamed to its sampling keyword; ConfigError when both
    names are given with different values."""
    if not any(a in kw for a in _SAMPLING_ALIASES):
        return kw
    out = dict(kw)
    for alias, name in _SAMPLING_ALIASES.items():
        if alias not in out:
            continue
        value = out.pop(alias)
        if value is None:
            continue
        if out.get(name) is not None and out[name] != value:
            raise ConfigError(f"{alias} and {name}: both given, with different values "
                              f"({value!r} and {out[name]!r}); give one of them")
        out[name] = value
    return out


def _is_prompt_list(prompt) -> bool:
    """Whether `prompt` is a list of prompts (strings or token-id lists) rather than
    one prompt's token ids."""
    return isinstance(prompt, (list, tuple)) and bool(prompt) and all(
        isinstance(p, (str, list, tuple, np.ndarray)) for p in prompt)


def _accepts(cls, name: str) -> bool:
    """Whether the model class's constructor takes the keyword option `name`."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return name in params


class LLM:
    """A loaded model plus its tokenizer and chat template.

    `LLM(path, *, n_threads=None, seed=None, chat_template=None, skill=None, task=None,
    n_ctx=None, max_sessions=4, preload=None, verify="lazy", precision=None,
    max_batch=8, **model_options)`; model options are the
    architecture's keyword options (for Dory: loops, kv_mode, ...). `seed` is the
    default sampling seed of every call (None: fresh entropy per call). `preload=True`
    copies the file into anonymous (huge-page) memory instead of mapping it, see
    `cortiq.cmf.open`; None takes CORTIQ_PRELOAD, and where that is unset copies a file
    for the CPU when the copy gets huge pages and the file takes at most half the
    available memory (`cortiq.cmf.worth_preloading`). `verify` is
    `cortiq.cmf.open`'s: "lazy" checks every tensor's hash as the model is built (so a
    damaged file raises `cmf.HashMismatch` naming the tensor before anything runs),
    "full" every hash on open, "off" none. `precision` ("exact", "int8", "auto") is how
    the model's matrix products treat activations (see `cortiq.set_precision`); None
    follows the process default (CORTIQ_PRECISION, "auto" unless set), also when it
    changes later. `llm.precision` can be set later. `device` is "cpu", "gpu" (WebGPU
    through the `wgpu` package: Vulkan, Metal, DX12; docs/gpu.md) or "auto" (the GPU when
    a hardware adapter answers, else the CPU); None reads CORTIQ_DEVICE (default "cpu").
    Logits that are not finite (NaN/inf: a damaged file or a broken model) raise
    `ModelError` naming the position instead of sampling garbage.
    `max_batch`: how many concurrent generations (threads, the server) share one
    forward (continuous batching, `cortiq.runtime.scheduler`): each step reads the weights once
    for all of them; 1 runs every call on its own thread as before.
    `LLM.from_model(model, tokenizer=...)` wraps a model object that is already built;
    `LLM.from_pretrained(path_or_hub_id)` also takes a checkpoint directory or a Hub id.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, n_threads: int | None = None,
                 seed: int | None = None, chat_template: str | None = None, skill=None,
                 task: str | None = None, n_ctx: int | None = None, max_sessions: int = 4,
                 preload: bool | None = None, verify: str = "lazy",
                 precision: str | None = None, device: str | None = None,
                 max_batch: int = DEFAULT_MAX_BATCH, **model_options):
        self._precision = check_precision(precision)
        self._check_batch(max_batch)
        from ..gpu.device import resolve_device
        self.device = resolve_device(device)
        if path is None:  # the bundled demo model (src/cortiq/demo.py)
            from ..demo import demo_path
            path = demo_path()
        if preload is None:
            preload = preload_default()
        elif not isinstance(preload, bool):
            raise ConfigError(f"preload: expected True, False or None, got {preload!r}")
        if n_threads is not None:
            set_num_threads(n_threads)
        self.path = os.fspath(path)
        if preload is None:
            from ..cmf import worth_preloading
            # the GPU uploads the weights once: a copy on the host gains nothing
            preload = self.device == "cpu" and worth_preloading(self.path)
        from .model_file import open_model_file
        self.file = open_model_file(self.path, preload=preload, verify=verify)
        try:
            from ..models import model_class
            from ..models.overlay import SkillRouter, normalize_skill
            arch = self.file.arch.get("arch_name")
            self._cls = model_class(arch)
            self._model_options = dict(model_options)
            if task is not None:
                if not isinstance(task, str) or not task:
                    raise ConfigError(f"task: expected a mask task name, got {task!r}")
                if not _accepts(self._cls, "task"):
                    raise ConfigError(f"task={task!r}: the {arch} architecture has no MoE "
                                      "routing to restrict, so the `task` option cannot be "
                                      "used with it")
                masks = self.file.masks
                if masks is None or task not in masks:
                    have = ", ".join(masks.names()) if masks is not None else "none"
                    raise ConfigError(f"task={task!r}: {self.path} has no such mask task "
                                      f"(tasks: {have})")
                self._model_options["task"] = task
            self.skill = normalize_skill(self.file, skill)
            self._router = SkillRouter(self.file) if self.skill == "auto" else None
            self._models: dict = {}
            model = self._build_model(None if self.skill == "auto" else self.skill)
            tok = self._open_tokenizer()
            name = os.path.splitext(os.path.basename(self.path))[0]
            max_pos = self.file.arch.get("max_position_embeddings")
            self._setup(model, tok, chat_template, seed, name, n_ctx, max_sessions, max_pos,
                        max_batch)
        except BaseException:
            self.file.close()
            raise

    def _open_tokenizer(self) -> Tokenizer:
        """The file's tokenizer. Only a file without any (no vocab section, no sidecar
        tokenizer.json) falls back to raw UTF-8 bytes (upstream's rule: sessions still
        take ids); a tokenizer that is there but unreadable is a damaged file."""
        side = os.path.join(os.path.dirname(os.path.abspath(self.path)), "tokenizer.json")
        has_one = self.file.sections()["vocab"][1] > 0 or os.path.exists(side)
        try:
            return Tokenizer.from_cmf(self.file)
        except _cmf.HashMismatch:
            raise
        except FormatError as e:
            if has_one:
                raise FormatError(f"{self.path}: the tokenizer cannot be read ({e}) -- the "
                                  "file may be damaged: run cortiq verify") from None
            warnings.warn(f"{e}; text is tokenized as raw UTF-8 bytes", RuntimeWarning,
                          stacklevel=3)
            return Tokenizer.bytes_only(getattr(self.file, "tokenizer_config", None))

    @classmethod
    def from_pretrained(cls, repo_or_path, *, quant: str | None = None, cache_dir=None,
                        revision: str | None = None, filename: str | None = None,
                        progress: bool | None = None, **kwargs) -> LLM:
        """An LLM over a .cmf file, a .gguf file, a Hugging Face checkpoint directory
        (converted on first use into a cache of CMF files) or a Hub repo id (with
        huggingface_hub installed: ``"org/name"``, ``"org/name:Q4_K_M"`` for that quant
        of a GGUF repo, or ``filename=`` for one exact file), downloaded into the cache
        (`cortiq.pretrained.resolve`). `progress`: None shows download and conversion
        progress when stderr is a terminal. Other keywords go to `LLM`."""
        from ..pretrained import resolve
        return cls(resolve(repo_or_path, quant=quant, cache=cache_dir, revision=revision,
                           filename=filename, progress=progress), **kwargs)

    @classmethod
    def from_model(cls, model, *, tokenizer, tokenizer_config: Mapping | None = None,
                   chat_template: str | None = None, seed: int | None = None,
                   name: str = "model", n_ctx: int | None = None,
                   max_sessions: int = 4, precision: str | None = None,
                   max_batch: int = DEFAULT_MAX_BATCH) -> LLM:
        """An LLM over a model object that implements the model protocol
        (`cortiq.models.base.Model`; deriving from `ModelBase` gives most of it):
        ConfigError naming what it lacks otherwise. `tokenizer`: a
        `cortiq.text.tokenizer.Tokenizer`, a `tokenizers.Tokenizer`, the bytes of a
        tokenizer.json or a path; `tokenizer_config`: a CMF chat bundle."""
        check_model(model)
        self = cls.__new__(cls)
        self._precision = check_precision(precision)
        self.device = "cpu"
        cls._check_batch(max_batch)
        model.set_precision(self._precision)
        self.path = None
        self.file = None  # type: ignore[assignment]  # no file behind a built model
        self.skill = None
        self._router = None
        self._models = {None: model}
        if not isinstance(tokenizer, Tokenizer):
            tokenizer = Tokenizer(tokenizer, tokenizer_config)
        self._setup(model, tokenizer, chat_template, seed, name, n_ctx, max_sessions,
                    model.capabilities.max_seq_len, max_batch)
        return self

    @staticmethod
    def _check_batch(max_batch) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)) \
                or max_batch < 1:
            raise ConfigError(f"max_batch: expected an integer >= 1, got {max_batch!r}")

    def _setup(self, model, tok, chat_template, seed, name, n_ctx, max_sessions, max_pos,
               max_batch=1):
        self.model = model
        self.tokenizer = tok
        self.model_name = name
        if seed is not None:
            SamplingParams(seed=seed)              # validates
        self.seed = seed
        # the sampling fields the model's file names as its own (its generation_config)
        self.generation_defaults = model_defaults(
            (tok.tokenizer_config or {}).get("generation_defaults"))
        # What create_completion / create_chat_completion (and so the server) sample with
        # where a field is left out: OpenAI's defaults, or the model's own.
        self.request_defaults = {**OPENAI_DEFAULTS, **self.generation_defaults}
        if chat_template is not None:
            self.chat_template = chat_template if isinstance(chat_template, ChatTemplate) \
                else ChatTemplate(chat_template, bos_token=tok.bos_token,
                                  eos_token=tok.eos_token)
        else:
            self.chat_template = ChatTemplate.from_bundle(tok.tokenizer_config or None, tok)
        cap = DEFAULT_MAX_CTX if max_pos is None else min(int(max_pos), DEFAULT_MAX_CTX)
        if n_ctx is not None:
            if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 2:
                raise ConfigError(f"n_ctx: expected an integer >= 2, got {n_ctx!r}")
            cap = n_ctx if max_pos is None else min(n_ctx, int(max_pos))
        self.n_ctx = cap
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) \
                or max_sessions < 0:
            raise ConfigError(f"max_sessions: expected an integer >= 0, got {max_sessions!r}")
        self.max_sessions = max_sessions
        self._idle: list[Session] = []
        self._lock = threading.Lock()
        self.max_batch = int(max_batch)
        self._scheduler = Scheduler(self.max_batch) if self.max_batch > 1 else None

    def watch_batches(self, watcher) -> bool:
        """Have `watcher.batch_step(requests, rows)` called after each batched forward,
        from the batching thread (requests in the step, token rows it carried). Held
        weakly. False when this LLM does not batch (max_batch=1)."""
        if self._scheduler is None:
            return False
        self._scheduler.watchers.add(watcher)
        return True

    # -- models and skills ------------------------------------------------------------
    def _build_model(self, overlay):
        from ..models.overlay import OverlayFile
        if not isinstance(overlay, dict) and overlay in self._models:
            return self._models[overlay]
        opts = dict(self._model_options)
        src = self.file
        if overlay is not None:
            src = OverlayFile(self.file, overlay)
            if _accepts(self._cls, "skill"):
                opts["skill"] = overlay
        model = check_model(self._cls(src, **opts))
        model.set_precision(self._precision)
        if self.device == "gpu":
            from ..gpu import to_device
            model = to_device(model)
        if not isinstance(overlay, dict):
            self._models[overlay] = model
        return model

    @property
    def precision(self) -> str | None:
        """The model's activation precision: "exact", "int8", "auto", or None (the
        process default, `cortiq.get_precision()`, is in force)."""
        return self._precision

    @precision.setter
    def precision(self, p) -> None:
        self._precision = check_precision(p)
        with self._lock:
            for m in list(self._models.values()):
                m.set_precision(p)

    @property
    def precision_in_force(self) -> str:
        """The precision the products use now (the process default when precision is None)."""
        return self._precision or get_precision()

    def _model_for(self, ids):
        """The model a prompt runs on (skill="auto": the routed skill's)."""
        if self._router is None:
            return self.model, self.skill
        sid = self.select_skill(ids)
        with self._lock:
            m = self._models.get(sid)
            if m is None:
                m = self._build_model(sid)
        return m, sid

    def skill_errors(self, prompt) -> dict:
        """skill="auto": {skill id: reconstruction error of the prompt's φ}."""
        from ..models.overlay import SkillRouter, mean_embedding
        router = self._router or (SkillRouter(self.file) if self.file is not None else None)
        if router is None or not router.entries:
            raise ConfigError("skill routing: the model file has no skill selection records")
        ids = self._prompt_ids(prompt)
        emb = mean_embedding(self.file, ids)
        return router.errors(lambda layer: emb)

    def select_skill(self, prompt) -> str:
        errs = self.skill_errors(prompt)
        return min(errs, key=lambda k: (errs[k], k))

    # -- properties -------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return self.model.arch

    @property
    def vocab_size(self) -> int:
        return self.model.vocab

    # -- tokens and templates ---------------------------------------------------------
    def tokenize(self, text: str | bytes, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (BOS as the tokenizer asks; special tokens written in the
        text become their ids)."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        if not isinstance(text, str):
            raise ConfigError(f"tokenize: expected a string, got {type(text).__name__}")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ConfigError(f"text: a lone UTF-16 surrogate {text[e.start]!r} at "
                                  f"character {e.start} is not valid Unicode") from None
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def detokenize(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tools=None,
                            **extra) -> str:
        """The prompt text of `messages` in OpenAI's shape: text parts joined and the
        `developer` role understood (`cortiq.text.chat.openai_messages`), then the
        model's chat template."""
        extra = {k: v for k, v in extra.items() if v is not None}
        messages = openai_messages(messages, self.chat_template)
        return self.chat_template.render(messages, add_generation_prompt, tools, **extra)

    def chat_prompt_ids(self, messages, tools=None, *, enable_thinking=None) -> list[int]:
        """The token ids `create_chat_completion` generates from for `messages`."""
        text = self.apply_chat_template(messages, True, tools, enable_thinking=enable_thinking)
        return self.tokenize(text, add_special_tokens=True)

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenize(prompt)
        elif isinstance(prompt, (list, tuple, np.ndarray)) and all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in prompt):
            ids = [int(i) for i in prompt]
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            if bad:
                raise ConfigError(f"prompt: token id {bad[0]} is outside the vocabulary "
                                  f"[0, {self.vocab_size})")
        else:
            raise ConfigError("prompt: expected a string or a list of token ids, got "
                              f"{type(prompt).__name__}")
        if not ids:
            raise ConfigError("prompt: empty prompt: nothing to generate from")
        if len(ids) >= self.n_ctx:
            raise ConfigError(f"prompt: {len(ids)} tokens do not fit the context of "
                              f"{self.n_ctx} tokens (at least one must be left to generate)")
        return ids

    # -- sessions ---------------------------------------------------------------------
    def session(self, skill=None) -> Session:
        """A new, empty sequence on this model (on skill `skill`'s weights when given;
        the file must have been opened with skill="auto" or that skill)."""
        if skill is None or skill == self.skill:
            return Session(self.model)
        if self._router is None:
            raise ConfigError(f"session(skill={skill!r}): this LLM was opened with "
                              f"skill={self.skill!r}; open it with skill='auto' to switch")
        with self._lock:
            m = self._models.get(skill) or self._build_model(skill)
        return Session(m)

    def feed_batch(self, sessions, ids_per_session, want="last", prompt=None) -> list:
        """Feed several sessions of this LLM in one forward: `ids_per_session[i]` to
        `sessions[i]` (lengths may differ: one session prefilling a chunk while others
        decode a token). Each weight matrix is read once for the rows of all of them;
        attention and the per-session state run per session. `want`: "none", "last"
        or "all" (or one per session); `prompt`: prompt rows or generated tokens
        (`Session.feed`; one flag or one per session). Returns one result per session,
        as `Session.feed` returns it: None, the last row of logits [vocab], or [n_i, vocab]."""
        sessions = list(sessions)
        mine = {id(m) for m in self._models.values()}
        for s in sessions:
            if isinstance(s, Session) and id(s.model) not in mine:
                raise ConfigError("feed_batch: a session of another model; sessions must "
                                  "come from this LLM (llm.session())")
        return _feed_batch(sessions, ids_per_session, want, prompt)

    def _checkout(self, model, ids) -> Session:
        with self._lock:
            best, best_n = None, -1
            for s in self._idle:
                if s.model is model:
                    n = s.common_prefix(ids)
                    if n > best_n:
                        best, best_n = s, n
            if best is not None:
                self._idle.remove(best)
                return best
        return Session(model)

    def _checkin(self, s: Session) -> None:
        if self.max_sessions == 0:
            return
        with self._lock:
            self._idle.append(s)
            del self._idle[:-self.max_sessions]        # drop the least recently used

    # -- sampling parameters ----------------------------------------------------------
    def _params(self, sampling: SamplingParams | None, kw: dict,
                defaults: Mapping | None = None) -> SamplingParams:
        """`sampling` (else `SamplingParams` of `defaults`, else its own defaults, with the
        LLM's seed) with the keywords given in `kw` replacing its fields."""
        kw = _resolve_aliases(kw)
        unknown = set(kw) - set(_SAMPLING_KEYS)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        given = {k: v for k, v in kw.items() if v is not None}
        base = sampling if sampling is not None else \
            SamplingParams(seed=self.seed, **(defaults or {}))
        if not isinstance(base, SamplingParams):
            raise TypeError(f"sampling: expected SamplingParams, got {type(base).__name__}")
        return base.replace(**given) if given else base

    @staticmethod
    def _max_tokens(max_tokens):
        """The token limit of a call: None or -1 (llama-cpp-python's spelling) mean until
        the context ends; anything else must be an integer >= 1."""
        if max_tokens is None or (isinstance(max_tokens, (int, np.integer))
                                  and not isinstance(max_tokens, bool) and max_tokens == -1):
            return None
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) \
                or max_tokens < 1:
            raise ConfigError(f"max_tokens: expected an integer >= 1, got {max_tokens!r}")
        return int(max_tokens)

    # -- the generation loop ----------------------------------------------------------
    def _generate(self, ids, params: SamplingParams, max_tokens, stop, session, res: Result,
                  cancel: threading.Event | None = None,
                  options: Options | None = None) -> Iterator[str]:
        """Yield text pieces as they become safe to show; fill `res`."""
        stop = normalize_stop(stop)
        limit = self.n_ctx - len(ids)
        if max_tokens is not None:
            limit = min(limit, max_tokens)
        own = session is None
        if own:
            model, res.skill = self._model_for(ids)
            session = self._checkout(model, ids)
        if self._scheduler is not None:
            yield from self._generate_batched(ids, params, limit, stop, session, own, res,
                                              cancel, options)
            return
        try:
            t0 = time.perf_counter()
            res.prompt_tokens = len(ids)
            if cancel is not None and cancel.is_set():     # e.g. gave up while queued
                res.finish_reason = "cancelled"
                return
            res.cached_tokens, logits = session.prefill(ids)
            t1 = time.perf_counter()
            res.prefill_s = t1 - t0
            gen = Generation(self.tokenizer, ids, params, limit, stop, res, options)

            def cancelled() -> bool:
                return cancel is not None and cancel.is_set()

            while not gen.done:
                if cancelled():
                    gen.cancel()
                    break
                piece = gen.step(logits)
                if piece:
                    yield piece
                if gen.done:
                    break
                if can_chain(session, gen):     # plain argmax: the device picks tokens
                    pieces = chained_pieces(session, gen, cancelled)
                    try:
                        for piece in pieces:
                            if piece:
                                yield piece
                    finally:
                        pieces.close()      # the chain holds the session until closed
                    if gen.done:
                        break
                    if cancelled():
                        gen.cancel()
                        break
                logits = session.feed([gen.token], want="last", prompt=False)
            tail = gen.finish()
            if tail:
                yield tail
            res.decode_s = time.perf_counter() - t1
        finally:
            if own:
                self._checkin(session)

    def _generate_batched(self, ids, params, limit, stop, session, own, res: Result,
                          cancel, options: Options | None = None) -> Iterator[str]:
        """`_generate` through the scheduler: this thread keeps the prefix the session
        holds, the scheduler thread runs the rest with the other requests."""
        release = self._checkin if own else None
        res.prompt_tokens = len(ids)
        if cancel is not None and cancel.is_set():
            res.finish_reason = "cancelled"
            if release is not None:
                release(session)
            return
        try:
            res.cached_tokens = session.prepare(ids)
            gen = Generation(self.tokenizer, ids, params, limit, stop, res, options)
            req = self._scheduler.submit(Request(session, gen, ids[res.cached_tokens:], res,
                                                 cancel, release))
        except BaseException:
            if release is not None:
                release(session)
            raise
        yield from req.pieces()

    def _run(self, prompt, max_tokens, stop, session, sampling, kw, cancel=None,
             options: Options | None = None, defaults: Mapping | None = None):
        ids = self._prompt_ids(prompt)
        params = self._params(sampling, kw, defaults)
        max_tokens = self._max_tokens(max_tokens)
        normalize_stop(stop)
        if session is not None and not isinstance(session, Session):
            raise TypeError(f"session: expected a cortiq Session, got {type(session).__name__}")
        res = Result()
        return res, self._generate(ids, params, max_tokens, stop, session, res, cancel, options)

    # -- per-request options ----------------------------------------------------------
    def _options(self, *, logprobs=None, grammar=None, response_format=None,
                 logits_processor=None, stopping_criteria=None) -> Options | None:
        """The `Options` of a request (None when it asks for none of them)."""
        if all(v is None for v in (logprobs, grammar, response_format, logits_processor,
                                   stopping_criteria)):
            return None
        from ..text import structured
        g = None
        if grammar is not None and response_format is not None and \
                response_format != {"type": "text"}:
            raise ConfigError("grammar and response_format: give one of them")
        if grammar is not None:
            g = structured.compile_grammar(grammar, self.tokenizer, self.vocab_size)
        elif response_format is not None:
            g = structured.compile_response_format(response_format, self.tokenizer,
                                                   self.vocab_size)
        return Options(logprobs=logprobs, grammar=g, logits_processor=logits_processor,
                       stopping_criteria=stopping_criteria)

    def embed(self, texts: str | list[str] | list[list[int]], pooling: str = "mean"
              ) -> np.ndarray:
        """Unit-norm embeddings from the final hidden state (`cortiq.runtime.embeddings`):
        [len(texts), hidden] float32, or [hidden] for one string. `pooling`: "mean"
        over the tokens or the "last" token's."""
        from .embeddings import embed
        return embed(self, texts, pooling)

    def load_state(self, data: bytes) -> Session:
        """A session restored from `Session.save_state()` bytes (`cortiq.runtime.state`), on
        whichever of this LLM's models (skills) saved it; StateError when they are
        damaged, truncated or saved on another model."""
        from .state import StateError
        with self._lock:
            models = [self.model, *(m for m in self._models.values() if m is not self.model)]
        err = None
        for m in models:
            try:
                return Session.load_state(m, data)
            except StateError as e:
                if "different model" not in str(e):
                    raise
                err = e
        raise err  # type: ignore[misc]

    def prompt_logprobs(self, ids, top: int = 0) -> list[TokenLogprob | int]:
        """Each prompt token's log-probability given the tokens before it (the first
        one: its bare id, as nothing predicts it), from one fresh forward over `ids`."""
        ids = self._prompt_ids(ids)
        model, _ = self._model_for(ids)
        rows = cast(np.ndarray, Session(model).feed(ids, want="all", prompt=True))
        n = self.tokenizer.vocab_size
        out: list[TokenLogprob | int] = [ids[0]]
        for i in range(1, len(ids)):
            check_finite(rows[i - 1], i - 1)
            lp = log_softmax(rows[i - 1][:n])
            tops: tuple = ()
            if top:
                idx = np.argsort(-lp, kind="stable")[:top]
                tops = tuple((int(j), float(lp[j])) for j in idx)
            out.append(TokenLogprob(ids[i], float(lp[ids[i]]), tops))
        return out

    def generate(self, prompt: str | list[int] | list[str] | list[list[int]], *,
                 max_tokens: int | None = DEFAULT_MAX_TOKENS,
                 stop: str | list[str] | None = None, stream: bool = False,
                 session: Session | None = None, sampling: SamplingParams | None = None,
                 grammar: str | None = None, logits_processor=None, stopping_criteria=None,
                 **sampling_kw) -> str | Iterator[str] | list[str]:
        """The continuation of `prompt` (a string or token ids): a string, or with
        `stream=True` an iterator of text pieces. A list of prompts (strings or token-id
        lists) gives the list of their continuations, generated concurrently (sharing
        forwards through the scheduler when `max_batch` > 1). Sampling keywords:
        temperature, top_k, top_p, min_p, repetition_penalty (alias repeat_penalty),
        presence_penalty, frequency_penalty, logit_bias, suppress_tokens, seed (-1:
        fresh entropy; defaults: `SamplingParams`'s). `max_tokens` None or -1: until the
        context ends. `grammar`: GBNF or Lark text the output must match
        (`cortiq.text.structured`); `logits_processor` / `stopping_criteria`:
        llama-cpp-python's hooks (`cortiq.runtime.generation`)."""
        if _is_prompt_list(prompt):
            return self._generate_many(
                list(prompt), stream=stream, session=session, max_tokens=max_tokens,
                stop=stop, sampling=sampling, grammar=grammar,
                logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                **sampling_kw)
        opts = self._options(grammar=grammar, logits_processor=logits_processor,
                             stopping_criteria=stopping_criteria)
        res, gen = self._run(prompt, max_tokens, stop, session, sampling, sampling_kw,
                             options=opts)
        if stream:
            return gen
        for _ in gen:
            pass
        return res.text

    def _generate_many(self, prompts: list, *, stream: bool, session, **kw) -> list[str]:
        """`generate` over each of `prompts`, up to `max_batch` at a time from worker
        threads, so the scheduler runs them in shared forwards; results in prompt order."""
        if stream:
            raise ConfigError("stream: not with a list of prompts (generate one prompt to "
                              "stream it)")
        if session is not None:
            raise ConfigError("session: not with a list of prompts (each prompt runs on "
                              "its own session)")
        ids = []
        for i, p in enumerate(prompts):          # refuse a bad prompt before any runs
            try:
                ids.append(self._prompt_ids(p))
            except ConfigError as e:
                raise ConfigError(f"prompt[{i}]: {e}") from None
        workers = min(len(ids), self.max_batch)
        if workers == 1:
            return [cast(str, self.generate(p, **kw)) for p in ids]
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=workers,
                                thread_name_prefix="cortiq-generate") as pool:
            return [cast(str, r) for r in pool.map(lambda p: self.generate(p, **kw), ids)]

    def __call__(self, prompt: str | list[int], **kw) -> Completion | Iterator[Completion]:
        """`create_completion(prompt, **kw)` (llama-cpp-python's `llm(prompt, ...)`)."""
        return self.create_completion(prompt, **kw)

    def create_embedding(self, input: str | list[str] | list[int] | list[list[int]],
                         model: str | None = None, *, encoding_format: str = "float",
                         pooling: str = "mean") -> EmbeddingList:
        """OpenAI's embeddings response (what POST /v1/embeddings returns) for `input`:
        a string, token ids, or a list of either. `model`: the name the response
        carries (default: this LLM's); `encoding_format` "float" or "base64";
        `pooling` as in `embed`."""
        from .embeddings import embedding_list
        items = [input] if isinstance(input, str) or not _is_prompt_list(input) else input
        ids = []
        for i, x in enumerate(items):
            if isinstance(x, str) and not x:
                raise ConfigError(f"input[{i}]: an empty string")
            try:
                ids.append(self._prompt_ids(x))
            except ConfigError as e:
                raise ConfigError(f"input[{i}]: {e}") from None
        vectors = self.embed(ids, pooling=pooling)
        return embedding_list(vectors, sum(map(len, ids)), model or self.model_name,
                              encoding_format)

    # -- OpenAI shapes ----------------------------------------------------------------
    def create_completion(self, prompt: str | list[int], *,
                          max_tokens: int | None = DEFAULT_MAX_TOKENS,
                          stop: str | list[str] | None = None, stream: bool = False,
                          session: Session | None = None,
                          sampling: SamplingParams | None = None, stream_options=None,
                          cancel: threading.Event | None = None, logprobs: int | None = None,
                          echo: bool = False, grammar: str | None = None,
                          response_format=None, logits_processor=None,
                          stopping_criteria=None, **sampling_kw
                          ) -> Completion | Iterator[Completion]:
        """An OpenAI `text_completion` dict, or with `stream=True` an iterator of chunk
        dicts (the last one carries finish_reason and usage). `logprobs=N` (0-20)
        adds each token's log-probability and its N most likely alternatives; `echo`
        puts the prompt in front of the text (and, with logprobs, the prompt tokens'
        log-probabilities). A sampling keyword left out takes `self.request_defaults`
        (OpenAI's, or the model's generation_config: docs/api.md)."""
        from .logprobs import completion_logprobs
        if not isinstance(echo, bool):
            raise ConfigError(f"echo: expected a boolean, got {echo!r}")
        opts = self._options(logprobs=logprobs, grammar=grammar,
                             response_format=response_format,
                             logits_processor=logits_processor,
                             stopping_criteria=stopping_criteria)
        res, gen = self._run(prompt, max_tokens, stop, session, sampling, sampling_kw, cancel,
                             opts, self.request_defaults)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = ""
        prompt_lp: list = []
        if echo:
            ids = self._prompt_ids(prompt)
            head = prompt if isinstance(prompt, str) else self.detokenize(ids)
            if logprobs is not None:
                prompt_lp = self.prompt_logprobs(ids, logprobs)

        def shape(text, finish, usage, entries=None, offset=0, prompt_entries=()):
            lp = None
            if logprobs is not None and entries is not None:
                lp = completion_logprobs(self.tokenizer, entries, text_offset=offset,
                                         prompt=prompt_entries)
            return {"id": cid, "object": "text_completion", "created": created,
                    "model": self.model_name,
                    "choices": [{"text": text, "index": 0, "logprobs": lp,
                                 "finish_reason": finish}],
                    "usage": usage}
        if not stream:
            for _ in gen:
                pass
            return shape(head + res.text, res.finish_reason, res.usage(), res.logprobs or [],
                         0, prompt_lp)

        def chunks():
            sent, offset = 0, 0
            if head:
                yield shape(head, None, None, [], 0, prompt_lp)
                offset = len(head)
            for piece in gen:
                new = (res.logprobs or [])[sent:]
                sent += len(new)
                yield shape(piece, None, None, new, offset)
                offset += len(piece)
            yield shape("", res.finish_reason, res.usage(), (res.logprobs or [])[sent:], offset)
        return chunks()

    def create_chat_completion(self, messages: list[dict], *, tools: list[dict] | None = None,
                               tool_choice: str | dict | None = None,
                               parallel_tool_calls: bool | None = None,
                               max_tokens: int | None = DEFAULT_MAX_TOKENS,
                               stop: str | list[str] | None = None, stream: bool = False,
                               session: Session | None = None,
                               sampling: SamplingParams | None = None, stream_options=None,
                               enable_thinking: bool | None = None,
                               cancel: threading.Event | None = None,
                               prompt_ids: list[int] | None = None, logprobs: bool = False,
                               top_logprobs: int | None = None,
                               response_format: dict | None = None,
                               grammar: str | None = None, logits_processor=None,
                               stopping_criteria=None, **sampling_kw
                               ) -> ChatCompletion | Iterator[ChatCompletionChunk]:
        """An OpenAI `chat.completion` dict, or with `stream=True` an iterator of
        `chat.completion.chunk` dicts. The conversation is rendered with the model's
        chat template; a pooled (or the given) session that holds an earlier turn
        re-reads only what changed. `prompt_ids`: the conversation already rendered
        and tokenized by `chat_prompt_ids` (then `messages` and `tools` are not read
        again: the server renders once, off its event loop).

        `tools` / `tool_choice` ("auto", "none", "required" or {"type": "function",
        "function": {"name": ...}}): calls the model writes in its template's syntax
        come back as `message.tool_calls` (`cortiq.text.tool_calls`); "required" and a
        named function constrain the output to such calls. With a template that marks
        thinking, the reply's ``<think>`` block comes back as
        `message.reasoning_content` (streamed: `delta.reasoning_content`) and the rest
        as content (`cortiq.text.reasoning`). `logprobs` /
        `top_logprobs` (0-20): per-token log-probabilities; `response_format`
        ({"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}) or
        `grammar`: structured output (`cortiq.text.structured`). Messages are taken in
        OpenAI's shape (text parts, the developer role: `apply_chat_template`); a
        sampling keyword left out takes `self.request_defaults` (docs/api.md)."""
        from ..text import reasoning
        from ..text import tool_calls as tc
        from .logprobs import chat_logprobs
        tools = tc.check_tools(tools)
        choice = tc.check_tool_choice(tool_choice, tools)
        if not isinstance(logprobs, bool):
            raise ConfigError(f"logprobs: expected a boolean, got {logprobs!r}")
        if top_logprobs is not None and not logprobs:
            raise ConfigError("top_logprobs: needs logprobs=true")
        template_source = getattr(self.chat_template, "source", None)
        fmt = tc.detect_format(template_source)
        parse_calls = choice not in (None, "none")
        if choice is not None and choice not in ("none", "auto"):
            if grammar is not None or response_format not in (None, {"type": "text"}):
                raise ConfigError("tool_choice required/named cannot be combined with "
                                  "response_format or grammar")
            grammar = tc.required_grammar(tools, choice, fmt, parallel_tool_calls is not False)
        opts = self._options(logprobs=(top_logprobs or 0) if logprobs else None,
                             grammar=grammar, response_format=response_format,
                             logits_processor=logits_processor,
                             stopping_criteria=stopping_criteria)
        if prompt_ids is None:
            prompt_ids = self.chat_prompt_ids(messages, tools, enable_thinking=enable_thinking)
        res, gen = self._run(prompt_ids, max_tokens, stop, session, sampling, sampling_kw,
                             cancel, opts, self.request_defaults)
        thinks = reasoning.template_thinks(template_source)
        # a grammar shapes the whole reply, so a constrained reply starts outside any
        # think block the prompt opened
        constrained = grammar is not None or response_format not in (None, {"type": "text"})
        in_think = thinks and not constrained and reasoning.prompt_opens_think(
            self.detokenize(prompt_ids[-8:]))
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        include_usage = bool((stream_options or {}).get("include_usage"))

        def lp(entries):
            return chat_logprobs(self.tokenizer, entries) if logprobs else None

        if not stream:
            for _ in gen:
                pass
            text = res.text
            message: dict = {"role": "assistant", "content": text}
            if thinks:
                thought, text = reasoning.split(text, in_think)
                message.update(content=text, reasoning_content=thought)
            finish = res.finish_reason
            if parse_calls:
                content, calls = tc.parse(text, fmt, tools)
                if calls:
                    if parallel_tool_calls is False:
                        calls = calls[:1]
                    message.update(content=content or None, tool_calls=calls)
                    finish = "tool_calls" if finish == "stop" else finish
            return cast(ChatCompletion, {
                "id": cid, "object": "chat.completion", "created": created,
                "model": self.model_name,
                "choices": [{"index": 0, "message": message,
                             "logprobs": lp(res.logprobs or []), "finish_reason": finish}],
                "usage": res.usage()})

        def chunk(delta, finish, usage=None, choices=True, entries=None):
            out = {"id": cid, "object": "chat.completion.chunk", "created": created,
                   "model": self.model_name,
                   "choices": [{"index": 0, "delta": delta,
                                "logprobs": lp(entries) if entries else None,
                                "finish_reason": finish}] if choices else []}
            if include_usage:
                out["usage"] = usage
            return out

        def chunks():
            calls_stream = tc.ToolCallStream(fmt, tools) if parse_calls else None
            thought_stream = reasoning.ReasoningStream(in_think) if thinks else None
            sent = 0
            yield chunk({"role": "assistant", "content": ""}, None)
            for piece in gen:
                new = (res.logprobs or [])[sent:]
                sent += len(new)
                if thought_stream is not None:
                    thought, piece = thought_stream.feed(piece)
                    if thought:
                        yield chunk({"reasoning_content": thought}, None, entries=new)
                        new = []
                if calls_stream is not None:
                    piece = calls_stream.feed(piece)
                if piece or new:
                    yield chunk({"content": piece}, None, entries=new)
            if thought_stream is not None:
                thought, piece = thought_stream.finish()
                if thought:
                    yield chunk({"reasoning_content": thought}, None)
                if calls_stream is not None:
                    piece = calls_stream.feed(piece)
                if piece:
                    yield chunk({"content": piece}, None)
            finish = res.finish_reason
            if calls_stream is not None:
                rest, calls = calls_stream.finish()
                if parallel_tool_calls is False:
                    calls = calls[:1]
                if rest:
                    yield chunk({"content": rest}, None)
                for i, c in enumerate(calls):
                    yield chunk({"tool_calls": [{"index": i, **c}]}, None)
                if calls and finish == "stop":
                    finish = "tool_calls"
            yield chunk({}, finish, entries=(res.logprobs or [])[sent:])
            if include_usage:
                yield chunk(None, None, res.usage(), choices=False)
        return chunks()

    def close(self) -> None:
        if getattr(self, "_scheduler", None) is not None:
            self._scheduler.close()
        with self._lock:
            self._idle.clear()
        if self.file is not None:
            self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"LLM({self.path or self.model_name!r}, arch={self.arch!r}, n_ctx={self.n_ctx})"
