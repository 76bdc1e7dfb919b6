"""Models from the Hugging Face Hub: which files of a repo to fetch, fetching them into
cortiq's cache (`cortiq.model_cache`), and Hub failures as one-line `ConfigError`s.

A model argument ``org/name`` is a Hub repo id; ``org/name:QUANT`` picks the GGUF file
of that quant (case-insensitive, llama.cpp's ``-hf repo:quant`` convention, e.g.
``:Q4_K_M``, ``:q8_0``); ``filename=`` picks one exact file. A repo with a
``config.json`` and safetensors weights and no selector is downloaded as a checkpoint
directory (to be converted to CMF). A GGUF repo without a selector gives its Q4_K_M
file when it has one (llama.cpp's default), its only quant when it has one, and
otherwise an error listing the quants there are. A split GGUF
(``...-00001-of-00003.gguf``) is downloaded whole, every part.

Downloads go into cortiq's cache directory (``huggingface_hub``'s ``local_dir``), one
entry per repo and selection, not into huggingface_hub's shared cache: `cortiq models`
lists them with their size and `cortiq rm` removes them without reaching into a cache
other programs (transformers, llama.cpp) use too. An entry whose download finished is
reused without contacting the Hub (so a downloaded model runs offline); remove it with
`cortiq rm` to fetch the repo again.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

from . import model_cache
from .errors import ConfigError

#: a Hub repo id with an optional :SELECTOR; local paths never reach this (see is_hub_id)
_HUB_ID = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)/([A-Za-z0-9][A-Za-z0-9_.-]*)"
                     r"(?::([A-Za-z0-9_.-]+))?$")
#: ggml quant names as GGUF file names carry them (Q4_K_M, IQ2_XXS, Q8_0, BF16, UD-Q4_K_XL)
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q\d+(?:_[A-Za-z0-9]+)*|TQ\d_\d|BF16|F16|"
                    r"F32|MXFP4(?:_MOE)?))(?![A-Za-z0-9])", re.IGNORECASE)
_SPLIT = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")
#: what a checkpoint directory download takes (the weights, config and tokenizer files)
_CHECKPOINT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model"]
DEFAULT_GGUF_QUANT = "Q4_K_M"
_INSTALL_HINT = "pip install 'cortiq[hub]'"


def parse_hub_id(text: str) -> tuple[str, str | None] | None:
    """(repo id, quant selector or None) when `text` has the form of a Hub id, else None.
    Names of model files (``x.cmf``, ``org/x.gguf``) are paths, never Hub ids."""
    m = _HUB_ID.match(text)
    if m is None or text.endswith((".cmf", ".gguf", ".safetensors")) or \
            m.group(1) in (".", ".."):
        return None
    return f"{m.group(1)}/{m.group(2)}", m.group(3)


def quant_of(filename: str) -> str | None:
    """The ggml quant a GGUF file's name carries (upper case), None when it names none."""
    parts = filename.split("/")
    for part in reversed(parts):
        m = _SPLIT.match(part)
        stem = m.group(1) if m else re.sub(r"\.gguf$", "", part)
        found = _QUANT.findall(stem)
        if found:
            return found[-1].upper()
    return None


def split_part(filename: str) -> tuple[str, int, int] | None:
    """(prefix, part, of) of a split GGUF part's name, None for a whole file."""
    m = _SPLIT.match(filename)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def _model_ggufs(files) -> list[str]:
    """The repo's GGUF model files (multimodal projectors are not models)."""
    return sorted(f for f in files if f.endswith(".gguf")
                  and not f.rsplit("/", 1)[-1].lower().startswith("mmproj"))


def _with_parts(files, chosen: str) -> list[str]:
    """`chosen` and, for a split part, every part of its set (in order)."""
    sp = split_part(chosen)
    if sp is None:
        return [chosen]
    parts = sorted(f for f in files if (s := split_part(f)) and s[0] == sp[0] and s[2] == sp[2])
    if len(parts) != sp[2]:
        raise ConfigError(f"{chosen}: the repo has {len(parts)} of its {sp[2]} parts")
    return parts


def pick_files(repo: str, files: list[str], selector: str | None,
               filename: str | None) -> tuple[str, list[str], str | None]:
    """What to download from `repo` (whose files are `files`): ("gguf", the file and
    its split parts, its quant) or ("checkpoint", [], None). ConfigError naming the
    choices when the selection matches nothing or more than one file."""
    ggufs = _model_ggufs(files)
    if filename is not None:
        if selector is not None:
            raise ConfigError(f"{repo}:{selector}: give a quant selector or filename=, "
                              "not both")
        if filename not in files:
            near = ", ".join(ggufs) or ", ".join(sorted(files)[:20]) or "none"
            raise ConfigError(f"{repo}: no file {filename!r} in the repo (files: {near})")
        if not filename.endswith(".gguf"):
            raise ConfigError(f"{repo}/{filename}: filename= picks a .gguf file; a "
                              f"safetensors checkpoint is fetched whole: give {repo}")
        return "gguf", _with_parts(files, filename), quant_of(filename)
    quants: dict[str, list[str]] = {}
    for f in ggufs:
        q = quant_of(f)
        if q is not None:
            quants.setdefault(q, []).append(f)
    if selector is not None:
        want = selector.upper()
        matches = sorted({f for q, fs in quants.items() if q == want or q.endswith("-" + want)
                          for f in fs})
        if not matches:
            have = ", ".join(sorted(quants)) or "no GGUF files"
            raise ConfigError(f"{repo}:{selector}: the repo has no {want} GGUF file "
                              f"(quants: {have})")
        return "gguf", _one_set(repo, selector, files, matches), quant_of(matches[0])
    if "config.json" in files and any(f.endswith(".safetensors") for f in files):
        return "checkpoint", [], None
    if not ggufs:
        raise ConfigError(f"{repo}: neither a checkpoint (config.json and .safetensors "
                          "weights) nor GGUF files in the repo")
    if len(quants) == 1:
        only = next(iter(quants.values()))
        return "gguf", _one_set(repo, None, files, only), quant_of(only[0])
    if DEFAULT_GGUF_QUANT in quants:
        return "gguf", _one_set(repo, DEFAULT_GGUF_QUANT, files,
                                quants[DEFAULT_GGUF_QUANT]), DEFAULT_GGUF_QUANT
    if not quants and len(ggufs) == 1:
        return "gguf", _with_parts(files, ggufs[0]), None
    raise ConfigError(f"{repo}: several GGUF files and no {DEFAULT_GGUF_QUANT}; pick one "
                      f"with {repo}:QUANT (quants: {', '.join(sorted(quants)) or 'none'}) "
                      "or --filename NAME")


def _one_set(repo, selector, files, matches) -> list[str]:
    """The one file (or split set) among `matches`; ConfigError listing them otherwise."""
    sets = {(s[0] if (s := split_part(f)) else f) for f in matches}
    if len(sets) > 1:
        label = f"{repo}:{selector}" if selector else repo
        raise ConfigError(f"{label}: several GGUF files match ({', '.join(matches)}); "
                          "pick one with --filename NAME (filename= in Python)")
    return _with_parts(files, matches[0])


def entry_name(repo: str, selector: str | None, filename: str | None,
               revision: str | None) -> str:
    """The cache entry a download of this selection goes into."""
    name = repo.replace("/", "--")
    if selector is not None:
        name += "--" + selector.upper()
    elif filename is not None:
        name += "--" + re.sub(r"[^A-Za-z0-9._-]+", "_", filename.removesuffix(".gguf"))
    if revision is not None:
        name += "@" + re.sub(r"[^A-Za-z0-9._-]+", "_", revision)
    return name


@contextlib.contextmanager
def _progress_bars(on: bool):
    """huggingface_hub's own download bars on or off for the duration (restored after)."""
    from huggingface_hub.utils import (are_progress_bars_disabled, disable_progress_bars,
                                       enable_progress_bars)
    was_off = are_progress_bars_disabled()
    (enable_progress_bars if on else disable_progress_bars)()
    try:
        yield
    finally:
        (disable_progress_bars if was_off else enable_progress_bars)()


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        return None
    return huggingface_hub


def fetch(repo: str, selector: str | None = None, *, filename: str | None = None,
          revision: str | None = None, cache=None, progress: bool = False) -> Path:
    """The local path of `repo`'s model: a checkpoint directory, or a GGUF file (the
    first part of a split one), downloaded into the cache once."""
    entry = model_cache.cache_dir(cache) / entry_name(repo, selector, filename, revision)
    done = model_cache.read_manifest(entry)
    if done.get("complete") and all((entry / f).exists() for f in done.get("files", [])):
        model_cache.touch(entry)
        return entry / done["path"]
    hub = _hub()
    if hub is None:
        raise ConfigError(f"{repo!r}: no such file or directory, and fetching it as a "
                          f"Hugging Face Hub repo id needs huggingface_hub ({_INSTALL_HINT})")
    try:
        files = list(hub.list_repo_files(repo, revision=revision))
        kind, picked, quant = pick_files(repo, files, selector, filename)
        entry.parent.mkdir(parents=True, exist_ok=True)
        with _progress_bars(progress):
            if kind == "checkpoint":
                hub.snapshot_download(repo, revision=revision, local_dir=entry,
                                      allow_patterns=_CHECKPOINT_PATTERNS)
                kept = sorted(str(p.relative_to(entry)) for p in entry.rglob("*")
                              if p.is_file() and ".cache" not in p.relative_to(entry).parts)
                path = "."
            else:
                for f in picked:
                    hub.hf_hub_download(repo, f, revision=revision, local_dir=entry)
                kept, path = picked, picked[0]
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 -- network, auth and Hub errors become one line
        raise hub_error(repo, revision, e) from None
    source = f"{repo}:{selector}" if selector else f"{repo}/{filename}" if filename else repo
    model_cache.write_manifest(entry, source_kind="hub", source=source, revision=revision,
                               format="safetensors" if kind == "checkpoint" else "gguf",
                               quant=quant, files=kept, path=path, complete=True)
    return entry / path


def hub_error(repo: str, revision, e: Exception) -> ConfigError:
    """A Hub failure as one line saying what to do about it."""
    name = type(e).__name__
    what = str(e).strip().splitlines()[0] if str(e).strip() else name
    if name in ("OfflineModeIsEnabled", "LocalEntryNotFoundError") or isinstance(
            e, (ConnectionError, TimeoutError)) or "Connect" in name or "Timeout" in name:
        return ConfigError(f"{repo}: cannot reach the Hugging Face Hub ({what}); offline, "
                           "only models already in the cache run: set HF_HUB_OFFLINE=1 to "
                           "stop trying the network, or give a local path")
    if name == "GatedRepoError":
        return ConfigError(f"{repo}: a gated repo: accept its terms on huggingface.co and "
                           "log in (hf auth login) or set HF_TOKEN")
    if name == "RepositoryNotFoundError":
        return ConfigError(f"{repo}: no such repo on the Hugging Face Hub (a private one "
                           "needs a login: hf auth login, or HF_TOKEN); a local path must "
                           "exist")
    if name == "RevisionNotFoundError":
        return ConfigError(f"{repo}: no revision {revision!r} in the repo")
    if name in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
        return ConfigError(f"{repo}: a file is missing from the repo ({what})")
    return ConfigError(f"{repo}: could not fetch from the Hugging Face Hub: {what}")
