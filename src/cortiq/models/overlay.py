"""Skill overlays (docs/cmf-format.md §11, docs/runtime.md §1) and skill routing.

A skill replaces whole tensors: `skill.{id}.{name}` is used instead of `name`. A
*blend* `{"a": 0.7, "b": 0.3}` uses `Σ wᵢ·Tᵢ` for every tensor some listed skill
replaces (Tᵢ = that skill's replacement, else the backbone tensor), held as f32.

`OverlayFile(cmf_file, overlay)` is a view of an open CmfFile in which `tensor`,
`raw`, `info` and `resolve` already apply the overlay, so a model constructor that
only knows `cf.tensor(name)` / `QTensor.from_cmf(cf, name)` loads the skill's
weights unchanged (single skills stay memory-mapped; blends are materialised f32 and
appear with dtype "f32"). Model constructors that want to do it themselves take a
`skill=` keyword (None | str | {id: weight}) and call
`overlay_tensor(cf, name, skill)`; `cortiq.LLM` passes both the view and, when the
constructor accepts it, the keyword.

Routing (`skill="auto"`): each skill with a `selection` record holds a mean μ and an
orthonormal basis B [rank, hidden] of its "home" subspace; the prompt's feature φ
picks the skill with the smallest ‖r − Bᵀ(B r)‖² / ‖r‖², r = φ − μ.
"""
from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from ..errors import ConfigError

__all__ = ["OverlayFile", "SkillRouter", "normalize_skill", "overlay_tensor"]

# Names the embedding matrix goes by, for the mean-embedding φ fallback.
EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "tok_embeddings.weight",
               "model.embed.weight", "embed.weight", "token_embd.weight", "wte.weight")
# Layouts whose payload is rows stored one after another (a row can be cut out).
_ROW_MAJOR = ("f32", "f16", "bf16", "q8_row", "q4_block")


def _skill_ids(cf) -> set:
    ids = {s.get("id") for s in cf.skills if isinstance(s, Mapping)}
    for k in cf.tensors:
        if k.startswith("skill."):
            ids.add(k.split(".", 2)[1])
    return {i for i in ids if isinstance(i, str)}


def normalize_skill(cf, skill):
    """`skill` as None, a skill id, "auto" or a {id: weight} blend; ConfigError naming
    the `skill` option for anything the file cannot serve."""
    if skill is None or skill == "none":
        return None
    known = _skill_ids(cf)
    listing = ", ".join(sorted(known)) or "none"
    if isinstance(skill, str):
        if skill == "auto":
            if not any(isinstance(s, Mapping) and s.get("selection") for s in cf.skills):
                raise ConfigError(f"skill='auto': {cf.path} has no skill with a selection "
                                  f"record (skills: {listing})")
            return "auto"
        if skill not in known:
            raise ConfigError(f"skill={skill!r}: {cf.path} has no such skill (skills: {listing})")
        return skill
    if isinstance(skill, Mapping):
        if not skill:
            raise ConfigError("skill: an empty blend")
        out = {}
        for k, w in skill.items():
            if k not in known:
                raise ConfigError(f"skill blend: {cf.path} has no skill {k!r} (skills: {listing})")
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) \
                    or w < 0:
                raise ConfigError(f"skill blend: weight of {k!r} must be a finite number >= 0, "
                                  f"got {w!r}")
            out[k] = float(w)
        if len(out) == 1 and next(iter(out.values())) == 1.0:
            return next(iter(out))
        return out
    raise ConfigError(f"skill: expected None, a skill id, 'auto' or a {{id: weight}} mapping, "
                      f"got {type(skill).__name__}")


def overlay_tensor(cf, name: str, skill) -> np.ndarray:
    """`name` under `skill` (None | id | {id: weight}) as float32 (§5.1 `load_f32`)."""
    if skill is None or isinstance(skill, str):
        return cf.tensor(name, skill=skill)
    if not any(f"skill.{s}.{name}" in cf.tensors for s in skill):
        return cf.tensor(name)
    acc = None
    for s, w in skill.items():
        t = cf.tensor(name, skill=s).astype(np.float32, copy=False)
        acc = t * np.float32(w) if acc is None else acc + np.float32(w) * t
    return np.ascontiguousarray(acc, dtype=np.float32)


class _TensorsView(Mapping):
    """`OverlayFile.tensors`: the directory with every name resolved through the overlay."""

    def __init__(self, view):
        self._view = view

    def __getitem__(self, name):
        if name not in self._view._cf.tensors:
            raise KeyError(name)
        return self._view.info(name)

    def __iter__(self):
        return iter(self._view._cf.tensors)

    def __len__(self):
        return len(self._view._cf.tensors)

    def __contains__(self, name):
        return name in self._view._cf.tensors


class OverlayFile:
    """A CmfFile seen through a skill overlay (see the module docstring). `skill=None`
    (or no `skill`) in `tensor`/`resolve` means the view's overlay, so loaders that pass
    `skill=None` explicitly (QTensor.from_cmf) get the skill's weights too."""

    def __init__(self, cf, overlay):
        self._cf = cf
        self.overlay = overlay
        self._blended: dict = {}
        self.tensors = _TensorsView(self)

    def __getattr__(self, attr):                 # everything else: the real file
        return getattr(self._cf, attr)

    def __contains__(self, name) -> bool:
        return name in self._cf

    def _blend(self, name):
        return isinstance(self.overlay, Mapping) and any(
            f"skill.{s}.{name}" in self._cf.tensors for s in self.overlay)

    def resolve(self, name: str, skill=None) -> str:
        skill = self.overlay if skill is None else skill
        if isinstance(skill, Mapping):
            return name
        return self._cf.resolve(name, skill)

    def tensor(self, name: str, skill=None) -> np.ndarray:
        skill = self.overlay if skill is None else skill
        if isinstance(skill, Mapping) and skill is self.overlay and self._blend(name):
            return self._blended_array(name).copy()
        return overlay_tensor(self._cf, name, skill)

    def _blended_array(self, name):
        a = self._blended.get(name)
        if a is None:
            a = overlay_tensor(self._cf, name, self.overlay)
            a.setflags(write=False)
            self._blended[name] = a
        return a

    def info(self, name: str):
        if self._blend(name):
            t = self._cf.info(name)
            a = self._blended_array(name)
            return dataclasses.replace(t, dtype="f32", offset=-1, nbytes=a.nbytes, hash=0)
        return self._cf.info(self.resolve(name))

    def raw(self, name: str) -> np.ndarray:
        if self._blend(name):
            return self._blended_array(name).reshape(-1).view(np.uint8)
        return self._cf.raw(self.resolve(name))

    def __repr__(self):
        return f"OverlayFile({self._cf!r}, skill={self.overlay!r})"


def _f16_b64(text, n, what):
    try:
        raw = base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{what}: not base64: {e}") from None
    a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if n is not None and a.size != n:
        raise ConfigError(f"{what}: {a.size} values, expected {n}")
    return a


class SkillRouter:
    """skill="auto": picks a skill per prompt from the registry's selection subspaces."""

    def __init__(self, cf):
        hidden = int(cf.arch.get("hidden_size", 0)) or None
        self.path = cf.path
        self.entries = []           # (id, phi_layer, mean [h], basis [rank, h])
        for i, rec in enumerate(cf.skills):
            sel = rec.get("selection") if isinstance(rec, Mapping) else None
            if not sel:
                continue
            what = f"{cf.path}: skills[{i}] ({rec.get('id')!r}).selection"
            mean = _f16_b64(sel.get("mean", ""), hidden, what + ".mean")
            rank = sel.get("rank")
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise ConfigError(f"{what}.rank: expected an integer >= 0, got {rank!r}")
            basis = _f16_b64(sel.get("basis", ""), rank * mean.size, what + ".basis")
            self.entries.append((rec["id"], int(sel.get("phi_layer", 0)), mean,
                                 basis.reshape(rank, mean.size)))
        self.layers = sorted({e[1] for e in self.entries})

    @staticmethod
    def error(phi: np.ndarray, mean: np.ndarray, basis: np.ndarray) -> float:
        r = np.asarray(phi, np.float64) - mean
        rr = float(r @ r)
        if rr == 0.0:
            return 0.0
        res = r - basis.T.astype(np.float64) @ (basis.astype(np.float64) @ r)
        return float(res @ res) / rr

    def errors(self, phi_of) -> dict:
        """{skill id: reconstruction error}; `phi_of(layer)` -> φ [hidden]."""
        phis = {layer: phi_of(layer) for layer in self.layers}
        return {sid: self.error(phis[layer], mean, basis)
                for sid, layer, mean, basis in self.entries}

    def pick(self, phi_of) -> str:
        errs = self.errors(phi_of)
        return min(errs, key=lambda k: (errs[k], k))


def _row_payload(raw, dtype: str, rows: int, cols: int, i: int) -> np.ndarray:
    """Row i of a [rows, cols] payload as the payload of a [1, cols] tensor. q8_row and
    q4_block keep every row's codes first and the scales after them (docs/cmf-format.md
    §7.2, §7.4), so a row is its codes plus its own scales; q4_block rows must be whole
    groups (cols % 32 == 0)."""
    from ..cmf.quant import GROUP
    if dtype == "q8_row":
        n = rows * cols
        return np.concatenate([raw[i * cols:(i + 1) * cols], raw[n + 2 * i:n + 2 * i + 2]])
    if dtype == "q4_block":
        gpr = cols // GROUP
        packed = 16 * rows * gpr
        return np.concatenate([raw[16 * gpr * i:16 * gpr * (i + 1)],
                               raw[packed + 2 * gpr * i:packed + 2 * gpr * (i + 1)]])
    rb = raw.size // rows                       # f32, f16, bf16: plain row-major
    return raw[i * rb:(i + 1) * rb]


def mean_embedding(cf, ids) -> np.ndarray:
    """The mean of the embedding rows of `ids` (the φ fallback); rows are cut out of
    row-major layouts without dequantising the whole matrix."""
    from ..cmf import quant as Q
    name = next((n for n in EMBED_NAMES if n in cf.tensors), None)
    if name is None:
        raise ConfigError(f"skill='auto': {cf.path} has no embedding matrix (looked for "
                          f"{', '.join(EMBED_NAMES)}) to compute the prompt's mean embedding")
    t = cf.info(name)
    rows, cols = t.shape
    uniq, counts = np.unique(np.asarray(ids, np.int64), return_counts=True)
    if t.dtype in _ROW_MAJOR and (t.dtype != "q4_block" or cols % Q.GROUP == 0):
        raw = cf.raw(name)
        acc = np.zeros(cols, np.float64)
        for i, c in zip(uniq.tolist(), counts.tolist()):
            acc += c * Q.dequantize(_row_payload(raw, t.dtype, rows, cols, i), t.dtype,
                                    (1, cols))[0]
    else:
        m = cf.tensor(name)
        acc = (m[uniq].astype(np.float64) * counts[:, None]).sum(0)
    return (acc / counts.sum()).astype(np.float32)
