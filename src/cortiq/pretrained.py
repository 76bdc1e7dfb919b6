"""`LLM.from_pretrained`: open what the user has -- a .cmf file, a .gguf file, a Hugging
Face checkpoint directory, or (with ``huggingface_hub`` installed) a Hub repo id --
converting on first use into a cache of CMF files.

The cache key hashes what the conversion reads (config.json, the tokenizer and
generation files, each weight file's name, size and modification time, or the GGUF
file's), the quant and the converter, so an edited checkpoint converts again and an
unchanged one opens straight away. Files appear atomically (the CMF writer renames a
finished temporary over the name), so a crash or two processes converting at once never
leave a half-written model behind; the source is only ever read.

Cache directory: ``cache_dir=``, else ``$CORTIQ_CACHE``, else
``$XDG_CACHE_HOME/cortiq`` (``~/.cache/cortiq``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from .errors import ConfigError

#: files of a checkpoint directory whose bytes go into the key (small ones)
_KEY_FILES = ("config.json", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
              "special_tokens_map.json")
_CONVERTERS_VERSION = 1   # bump when a converter's output changes for the same input


def cache_dir(explicit=None) -> Path:
    if explicit is not None:
        return Path(explicit)
    from .kernels._config import env
    cache = env("CORTIQ_CACHE")
    if cache:
        return Path(cache)
    base = env("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cortiq"


def _stat_line(p: Path) -> str:
    st = p.stat()
    return f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}"


def source_key(src: Path, quant) -> str:
    """A hex digest of everything the conversion of `src` reads."""
    h = hashlib.sha256(f"cortiq-convert-{_CONVERTERS_VERSION}\0{quant}\0".encode())
    if src.is_file():
        h.update(_stat_line(src).encode())
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


def resolve(repo_or_path, *, quant=None, cache=None, revision=None, progress=False) -> Path:
    """The path of a CMF file for `repo_or_path`, converting (once) when needed."""
    src = Path(os.fspath(repo_or_path)).expanduser()
    if src.is_file() and src.suffix == ".cmf":
        if quant is not None:
            raise ConfigError(f"quant={quant!r}: {src} is already a CMF file")
        return src
    if not src.exists():
        src = _download(str(repo_or_path), revision)
    if src.is_file():
        if src.suffix != ".gguf":
            raise ConfigError(f"{src}: expected a .cmf or .gguf file or a checkpoint directory")
        kind = "gguf"
    elif (src / "config.json").is_file():
        kind = "hf"
    else:
        raise ConfigError(f"{src}: not a Hugging Face checkpoint directory (no config.json)")
    if kind == "hf":
        quant = quant or "q8_row"
    key = source_key(src, quant)
    out_dir = cache_dir(cache)
    out = out_dir / f"{_safe_name(src.stem if kind == 'gguf' else src.name)}-{key[:16]}.cmf"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    if kind == "gguf":
        from .convert.gguf_import import import_gguf
        import_gguf(src, out, quant=quant, progress=progress)
    else:
        from .convert import from_hf
        try:
            from_hf(src, out, quant=quant, progress=progress)
        except ImportError as e:
            raise ConfigError(f"converting {src} needs the 'convert' extra (pip install "
                              f"'cortiq[convert]'): {e}") from None
    note = out_dir / (out.name + ".source.json")
    tmp = note.with_name(f"{note.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"source": str(src.resolve()), "quant": quant, "key": key}))
    os.replace(tmp, note)
    return out


def _download(repo: str, revision) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ConfigError(f"{repo!r}: no such file or directory, and huggingface_hub is not "
                          "installed to fetch it as a Hub repo id (pip install "
                          "huggingface_hub), so give a local path") from None
    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=[
            "*.json", "*.safetensors", "*.jinja", "tokenizer.model"]))
    except Exception as e:  # noqa: BLE001 -- network/auth errors become one message
        raise ConfigError(f"{repo!r}: could not fetch from the Hugging Face Hub: {e}") from None
