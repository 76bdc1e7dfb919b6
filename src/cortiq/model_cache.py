"""cortiq's model cache: where converted checkpoints and Hub downloads live, what each
entry is, and how to list and remove entries (`cortiq models`, `cortiq rm`).

An entry is one file or one directory directly inside the cache directory (a converted
``.cmf``, or a folder of files downloaded from the Hub), and beside it a sidecar
manifest ``<entry>.manifest.json`` saying what it is: where it came from (a Hub id, a
checkpoint directory, a file), its format (cmf, gguf, safetensors), its quant, and when
it was made and last used. Manifests are written atomically (a temporary file renamed
over the name), so a listing never reads half of one.

Removal only ever touches entries directly inside the cache directory: a name with a
path separator or ``..`` matches nothing, a symbolic link is unlinked (never followed),
and every target is checked to sit inside the cache directory before anything goes.

Cache directory: ``cache_dir=``, else ``$CORTIQ_CACHE``, else
``$XDG_CACHE_HOME/cortiq`` (``~/.cache/cortiq``).
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

MANIFEST_SUFFIX = ".manifest.json"
_TEMP_MARK = ".tmp-"           # the CMF writer's and our own temporaries: never entries


def cache_dir(explicit=None) -> Path:
    """The cache directory in force (not created here)."""
    if explicit is not None:
        return Path(explicit).expanduser()
    from .kernels._config import env
    cache = env("CORTIQ_CACHE")
    if cache:
        return Path(cache).expanduser()
    base = env("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cortiq"


@dataclass
class Entry:
    """One cache entry as `cortiq models` lists it."""
    name: str                    # the file or directory name inside the cache directory
    path: Path
    source_kind: str = "?"       # hub | dir | file | ? (no manifest)
    source: str = ""             # the Hub id (with :QUANT or /filename) or the source path
    format: str = "?"            # cmf | gguf | safetensors
    quant: str | None = None
    size: int = 0                # bytes on disk, the manifest included
    last_used: float | None = None
    manifest: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"name": self.name, "path": str(self.path), "source_kind": self.source_kind,
                "source": self.source, "format": self.format, "quant": self.quant,
                "size": self.size, "last_used": self.last_used}


def manifest_path(entry: Path) -> Path:
    return entry.with_name(entry.name + MANIFEST_SUFFIX)


def write_manifest(entry: Path, **fields) -> None:
    """Record what `entry` is (atomically); keeps the creation time of an older one."""
    old = read_manifest(entry)
    now = time.time()
    data = {**old, **fields, "name": entry.name, "last_used": now}
    data.setdefault("created", now)
    _write_json_atomically(manifest_path(entry), data)


def read_manifest(entry: Path) -> dict:
    try:
        data = json.loads(manifest_path(entry).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def touch(entry: Path) -> None:
    """Note that `entry` was used now (the listing's "last used"); a cache entry without
    a manifest, or one that cannot be written (a read-only cache), is left as it is."""
    data = read_manifest(entry)
    if not data:
        return
    data["last_used"] = time.time()
    try:
        _write_json_atomically(manifest_path(entry), data)
    except OSError:
        pass


def _write_json_atomically(path: Path, data: dict) -> None:
    tmp = path.with_name(f"{path.name}{_TEMP_MARK}{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def _size_on_disk(path: Path) -> int:
    """Bytes of the files under `path`, links not followed (they count as themselves)."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def list_entries(cache=None) -> list[Entry]:
    """Every entry of the cache directory, by name (an empty list when it does not exist)."""
    root = cache_dir(cache)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for name in names:
        if name.endswith(MANIFEST_SUFFIX) or _TEMP_MARK in name or name.startswith("."):
            continue
        path = root / name
        m = read_manifest(path)
        size = _size_on_disk(path) + _size_on_disk(manifest_path(path))
        fmt = m.get("format") or _format_of(path)
        out.append(Entry(name=name, path=path, source_kind=m.get("source_kind", "?"),
                         source=m.get("source", ""), format=fmt, quant=m.get("quant"),
                         size=size, last_used=m.get("last_used"), manifest=m))
    return out


def _format_of(path: Path) -> str:
    """The format of an entry without a manifest, from its name."""
    for suffix in (".cmf", ".gguf"):
        if path.name.endswith(suffix):
            return suffix[1:]
    return "?"


def find_entries(names, *, cache=None, every: bool = False) -> list[Entry]:
    """The entries `names` pick: each a listed name or a unique prefix of one.

    ConfigError for a name that matches nothing (listing what there is), one that
    matches several entries (listing them), or one that is a path rather than a name."""
    entries = list_entries(cache)
    if every:
        return entries
    picked: list[Entry] = []
    for name in names:
        if not name or name in (".", "..") or "/" in name or os.sep in name or (
                os.altsep and os.altsep in name):
            raise ConfigError(f"{name!r}: not a cache entry name (give a name that "
                              f"`cortiq models` lists, not a path)")
        exact = [e for e in entries if e.name == name]
        matches = exact or [e for e in entries if e.name.startswith(name)]
        if not matches:
            have = ", ".join(e.name for e in entries) or "the cache is empty"
            raise ConfigError(f"{name!r}: no such entry in {cache_dir(cache)} ({have})")
        if len(matches) > 1:
            raise ConfigError(f"{name!r} is ambiguous: it starts "
                              f"{', '.join(e.name for e in matches)}; give more of the name")
        if matches[0] not in picked:
            picked.append(matches[0])
    return picked


def remove(entry: Entry, cache=None) -> None:
    """Delete `entry` and its manifest, never anything outside the cache directory."""
    root = cache_dir(cache).resolve()
    target = root / entry.name
    # the entry's own name must sit directly inside the cache (resolving only the parent:
    # a link inside the cache is removed as a link, never followed)
    if target.parent.resolve() != root or entry.name in ("", ".", ".."):
        raise ConfigError(f"{entry.name!r}: not inside the cache directory {root}")
    st = target.lstat() if os.path.lexists(target) else None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(target)
        else:
            target.unlink()
    m = manifest_path(target)
    if os.path.lexists(m):
        m.unlink()
