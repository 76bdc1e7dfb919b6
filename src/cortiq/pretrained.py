"""The one model argument every front end takes: `resolve` turns a .cmf file, a .gguf
file, a Hugging Face checkpoint directory or a Hub repo id (``org/name``,
``org/name:Q4_K_M``, with ``filename=``; `cortiq.hub`) into the local file `LLM` opens.
`LLM.from_pretrained` and every `cortiq` command that takes a model go through it.

* A .cmf file is opened as it is; a .gguf file too (files are told apart by their first
  bytes, so a renamed one still opens), and any part of a split GGUF
  (``x-00001-of-00003.gguf``: `cortiq.gguf.split`) stands for the whole set.
  ``quant=`` re-quantizes a GGUF file (or set) into a CMF file in the cache
  (`cortiq import-gguf` does the same to a path of your choice).
* A folder without a config.json that holds one model -- one .cmf or .gguf file, or
  the parts of one split set (``mmproj-*`` projectors aside) -- stands for that model;
  one holding several is refused with the list to choose from.
* A checkpoint directory (config.json and safetensors weights) is converted on first
  use into a CMF file in the cache (`cortiq.model_cache`), ``quant=`` (default q8_row).
* A Hub id is downloaded into the cache (`cortiq.hub`), then treated as above.

The cache key of a conversion hashes what it reads (config.json, the tokenizer and
generation files, each weight file's name, size and modification time, or those of
the GGUF file or of every part of a split one), the quant and the converter, so an edited checkpoint converts again and an
unchanged one opens straight away. Files appear atomically (the CMF writer renames a
finished temporary over the name), so a crash or two processes converting at once never
leave a half-written model behind; the source is only ever read.

Progress (downloads, conversions) is shown on a terminal: ``progress=None`` shows it
when stderr is a TTY, True always, False never.
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

from . import model_cache
from .errors import ConfigError
from .model_cache import cache_dir

__all__ = ["cache_dir", "file_format", "model_in_folder", "progress_default", "resolve",
           "source_key"]

#: files of a checkpoint directory whose bytes go into the key (small ones)
_KEY_FILES = ("config.json", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
              "special_tokens_map.json")
_CONVERTERS_VERSION = 1   # bump when a converter's output changes for the same input
_DEFAULT_CHECKPOINT_QUANT = "q8_row"
#: a part of a split model file: <name>-00001-of-00003.gguf (or .cmf)
_SPLIT_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})(\.gguf|\.cmf)$")


def progress_default(progress: bool | None) -> bool:
    """Progress on when asked, else when stderr is a terminal."""
    if progress is None:
        isatty = getattr(sys.stderr, "isatty", None)
        return bool(isatty and isatty())
    return bool(progress)


def _stat_line(p: Path) -> str:
    st = p.stat()
    return f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}"


def source_key(src: Path, quant) -> str:
    """A hex digest of everything the conversion of `src` reads."""
    h = hashlib.sha256(f"cortiq-convert-{_CONVERTERS_VERSION}\0{quant}\0".encode())
    if src.is_file():
        for part in _model_set(src)[1]:        # every part of a split set
            if part.exists():
                h.update(_stat_line(part).encode() + b"\0")
    else:
        for name in _KEY_FILES:
            p = src / name
            if p.exists():
                h.update(name.encode() + b"\0" + p.read_bytes() + b"\0")
        for p in sorted(src.glob("*.safetensors")) + sorted(src.glob("*.safetensors.index.json")):
            h.update(_stat_line(p).encode() + b"\0")
    return h.hexdigest()


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("._") or "model"


def resolve(repo_or_path, *, quant: str | None = None, cache=None,
            revision: str | None = None, filename: str | None = None,
            progress: bool | None = None) -> Path:
    """The local model file for `repo_or_path`: a .cmf or .gguf path, downloading and
    converting (once, into the cache) when needed. ConfigError, naming the argument and
    what would work, for anything else."""
    from .hub import fetch, parse_hub_id
    text = os.fspath(repo_or_path)
    src = Path(text).expanduser()
    show = progress_default(progress)
    if src.exists():
        for name, given in (("filename", filename), ("revision", revision)):
            if given is not None:
                raise ConfigError(f"{name}={given!r} picks from a Hub repo; {text} is a "
                                  "local path")
        source_kind, source = ("dir" if src.is_dir() else "file"), str(src.resolve())
    else:
        hub_id = parse_hub_id(text) if isinstance(repo_or_path, str) else None
        if hub_id is None:
            raise ConfigError(f"{text}: no such file or directory (a Hub repo id has the "
                              "form org/name or org/name:QUANT)")
        src = fetch(hub_id[0], hub_id[1], filename=filename, revision=revision,
                    cache=cache, progress=show)
        source_kind, source = "hub", text
    if src.is_dir() and not (src / "config.json").is_file():
        src = model_in_folder(src)          # a folder holding one model file (or split set)
    kind = _kind_of(src)
    if kind == "cmf":
        if quant is not None:
            raise ConfigError(f"quant={quant!r}: {src} is already a CMF file")
        _touch_if_cached(src, cache)
        return src
    if kind == "gguf" and quant is None:   # LLM opens GGUF files directly; quant=
        return src                         # re-quantizes
    return _convert(src, kind, quant or _DEFAULT_CHECKPOINT_QUANT, cache, show,
                    source_kind, source)


def file_format(path) -> str:
    """"cmf" or "gguf" for a model file `resolve` returned (by its first bytes)."""
    from .gguf import magic_format
    with open(path, "rb") as f:
        return magic_format(f.read(4)) or "cmf"


def model_in_folder(src: Path) -> Path:
    """The one model file (or first split part) of a folder without a config.json;
    ConfigError listing the choices when it holds several, or saying what to pass."""
    models = _models_in(src)
    if len(models) == 1:
        return models[0]
    hint = (f"; it holds {len(models)} models: pass one of them "
            f"({', '.join(p.name for p in models[:8])}{', ...' if len(models) > 8 else ''})"
            if models else "; pass a checkpoint directory (config.json and *.safetensors), "
            "a .cmf or .gguf file, or a Hub id org/name")
    raise ConfigError(f"{src}: not a Hugging Face checkpoint directory (no "
                      f"config.json){hint}")


def _kind_of(src: Path) -> str:
    """"cmf", "gguf" or "checkpoint" for a local path (a folder without a config.json
    never reaches here: `model_in_folder`); ConfigError naming what to pass."""
    if src.is_dir():
        return "checkpoint"
    try:
        with open(src, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise ConfigError(f"{src}: cannot read: {e.strerror or e}") from None
    from .gguf import magic_format
    kind = magic_format(head)
    if kind is not None:
        return kind
    if src.suffix == ".safetensors" or _looks_like_safetensors(head):
        raise ConfigError(f"{src}: a safetensors weight file; pass the checkpoint directory "
                          f"that holds it with its config.json ({src.parent})")
    if src.suffix in (".cmf", ".gguf"):
        raise ConfigError(f"{src}: not a {src.suffix[1:].upper()} file (bad magic "
                          f"{head[:4]!r}); the file may be damaged or truncated")
    raise ConfigError(f"{src}: expected a .cmf or .gguf file, a Hugging Face checkpoint "
                      "directory or a Hub id org/name")


def _looks_like_safetensors(head: bytes) -> bool:
    """A safetensors file starts with its header's length (8 bytes LE) and then '{'."""
    return len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 30


def _model_set(path: Path) -> tuple[str, list[Path]]:
    """(a name for the model, its files) of a model file: every part, in order, of a
    split set (``x-00001-of-00003.gguf`` or ``x-00001-of-00003.cmf``), else the file."""
    m = _SPLIT_NAME.match(path.name)
    if m is None:
        return path.stem, [path]
    count = int(m.group(3))
    return m.group(1), [path.with_name(f"{m.group(1)}-{i:05d}-of-{count:05d}{m.group(4)}")
                        for i in range(1, count + 1)]


def _models_in(folder: Path) -> list[Path]:
    """The model files of a folder, one per model: a whole .cmf or .gguf file, or the
    first part of a split set (multimodal projectors, mmproj-*.gguf, are not models)."""
    firsts: dict[str, Path] = {}
    for p in sorted(folder.iterdir()):
        if p.suffix not in (".cmf", ".gguf") or not p.is_file() or \
                p.name.lower().startswith("mmproj"):
            continue
        m = _SPLIT_NAME.match(p.name)
        key = f"{m.group(1)}\0{m.group(3)}{m.group(4)}" if m else p.name
        if key not in firsts or p.name < firsts[key].name:
            firsts[key] = p
    return sorted(firsts.values())

def _touch_if_cached(path: Path, cache) -> None:
    try:
        inside = path.resolve().parent == cache_dir(cache).resolve()
    except OSError:
        return
    if inside:
        model_cache.touch(path)


def _convert(src: Path, kind: str, quant: str, cache, progress: bool, source_kind: str,
             source: str) -> Path:
    """The cached CMF conversion of `src` (a checkpoint directory or a GGUF file)."""
    key = source_key(src, quant)
    out_dir = cache_dir(cache)
    label = source.rsplit("/", 1)[-1].split(":")[0] if source_kind == "hub" else (
        _model_set(src)[0] if kind == "gguf" else src.name)
    out = out_dir / f"{_safe_name(label)}-{_safe_name(quant)}-{key[:12]}.cmf"
    if out.is_file():
        model_cache.touch(out)
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    if progress:
        print(f"cortiq: converting {source} to CMF ({quant}) into {out} (once)",
              file=sys.stderr)
    if kind == "gguf":
        from .convert.gguf_import import import_gguf
        try:
            import_gguf(src, out, quant=quant, progress=progress)
        except ImportError as e:
            raise ConfigError(f"re-quantizing {src} needs the 'gguf' extra (pip install "
                              f"'cortiq[gguf]'): {e}") from None
    else:
        from .convert import from_hf
        try:
            from_hf(src, out, quant=quant, progress=progress)
        except ImportError as e:
            raise ConfigError(f"converting {src} needs the 'convert' extra (pip install "
                              f"'cortiq[convert]'): {e}") from None
    model_cache.write_manifest(out, source_kind=source_kind, source=source, format="cmf",
                               quant=quant, key=key, converted_from=kind)
    return out
