"""cortiq.models.overlay on a small CMF file written here: single skills and blends
(`overlay_tensor`, `OverlayFile`) against NumPy sums of the tensors the file holds,
`normalize_skill`'s refusals, the router's reconstruction error and choice, and the
mean-embedding fallback (docs/runtime.md §1, docs/cmf-format.md §11).

References: the arrays written to the file (f32 payloads decode exactly) or, for the
quantised ones, `CmfFile.tensor` (the reader's own decoding, which the overlay only
combines); sums in float64.
Tolerance: BLEND_RTOL = 1e-6 -- a blend is summed in float32 (one rounding per term
of at most three terms).
"""
from __future__ import annotations

import base64
import types

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cortiq import cmf
from cortiq.errors import ConfigError
from cortiq.models.overlay import (
    OverlayFile,
    SkillRouter,
    mean_embedding,
    normalize_skill,
    overlay_tensor,
)

BLEND_RTOL = 1e-6
H = 32                      # hidden size (q8_row rows of 32)
V = 24
EMB = "model.embed_tokens.weight"


def f16_b64(a) -> str:
    return base64.b64encode(np.asarray(a, "<f2").tobytes()).decode()


def _tensors(rng):
    return {EMB: rng.standard_normal((V, H)).astype(np.float32),
            "w.a": rng.standard_normal((4, H)).astype(np.float32),
            "w.b": rng.standard_normal(5).astype(np.float32),
            "w.c": rng.standard_normal((3, H)).astype(np.float32)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    rng = np.random.default_rng(5)
    base = _tensors(rng)
    skill = {"sql": {"w.a": rng.standard_normal((4, H)).astype(np.float32)},
             "math": {"w.a": rng.standard_normal((4, H)).astype(np.float32),
                      "w.b": rng.standard_normal(5).astype(np.float32),
                      "w.c": rng.standard_normal((3, H)).astype(np.float32)}}
    items = dict(base)
    for sid, repl in skill.items():
        items.update({f"skill.{sid}.{n}": a for n, a in repl.items()})
    arch = {"arch_name": "qwen3", "hidden_size": H, "intermediate_size": H, "num_layers": 1,
            "num_attention_heads": 1, "num_kv_heads": 1, "head_dim": H, "vocab_size": V,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-6}
    means = {"sql": rng.standard_normal(H), "math": rng.standard_normal(H)}
    bases = {"sql": np.linalg.qr(rng.standard_normal((H, 2)))[0].T,
             "math": np.linalg.qr(rng.standard_normal((H, 3)))[0].T}
    records = [{"id": s, "selection": {"metric": "mse", "phi_layer": 1 if s == "sql" else 0,
                                       "mean": f16_b64(means[s]), "basis": f16_b64(bases[s]),
                                       "rank": bases[s].shape[0]}} for s in ("sql", "math")]
    records.append({"id": "plain"})                  # registered, replaces nothing
    d = tmp_path_factory.mktemp("overlay")
    out = {}
    for quant, dtypes in (("f32", None), ("q8_row", {"w.b": "f32"})):
        p = str(d / f"{quant}.cmf")
        cmf.write(p, items, arch=arch, quant=quant, skills=records, dtypes=dtypes,
                  progress=False)
        out[quant] = p
    f16 = lambda a: np.asarray(a, "<f2").astype(np.float64)    # noqa: E731
    return out, base, skill, {s: (f16(means[s]), f16(bases[s])) for s in means}


@pytest.fixture(params=["f32", "q8_row"])
def cf(request, files):
    with cmf.open(files[0][request.param]) as f:
        yield f


def plain(cf, name, skill=None):
    """What the file holds for `name` under one skill (the reader's decoding)."""
    real = f"skill.{skill}.{name}"
    return cf.tensor(real if skill and real in cf.tensors else name).astype(np.float64)


def blend_ref(cf, name, weights):
    if not any(f"skill.{s}.{name}" in cf.tensors for s in weights):
        return plain(cf, name)
    return sum(w * plain(cf, name, s) for s, w in weights.items())


def test_f32_file_holds_what_was_written(files):
    path, base, skill, _ = files
    with cmf.open(path["f32"]) as f:
        assert np.array_equal(overlay_tensor(f, "w.a", "sql"), skill["sql"]["w.a"])
        assert np.array_equal(overlay_tensor(f, "w.b", "sql"), base["w.b"])
        assert np.array_equal(overlay_tensor(f, "w.c", None), base["w.c"])
        got = overlay_tensor(f, "w.a", {"sql": 0.25, "math": 0.75})
        want = 0.25 * skill["sql"]["w.a"].astype(np.float64) + \
            0.75 * skill["math"]["w.a"].astype(np.float64)
        assert np.allclose(got, want, rtol=BLEND_RTOL, atol=1e-7)


@pytest.mark.parametrize("name", ["w.a", "w.b", "w.c", EMB])
@pytest.mark.parametrize("weights", [{"sql": 0.7, "math": 0.3}, {"sql": 2.0, "math": 0.0},
                                     {"sql": 0.5, "plain": 0.5}, {"math": 0.4}])
def test_blend_is_the_weighted_sum(cf, name, weights):
    got = overlay_tensor(cf, name, weights)
    want = blend_ref(cf, name, weights)
    assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
    assert np.allclose(got, want, rtol=BLEND_RTOL, atol=1e-6 * np.abs(want).max())
    if not any(f"skill.{s}.{name}" in cf.tensors for s in weights):
        assert np.array_equal(got, cf.tensor(name))          # no skill touches it: as is


@given(st.dictionaries(st.sampled_from(["sql", "math", "plain"]),
                       st.floats(0, 4, allow_nan=False), min_size=1))
def test_blend_weights(files, weights):
    with cmf.open(files[0]["f32"]) as f:
        for name in ("w.a", "w.b"):
            want = blend_ref(f, name, weights)
            got = overlay_tensor(f, name, weights)
            assert np.allclose(got, want, rtol=BLEND_RTOL, atol=1e-6)


def test_overlay_file_single_skill(cf):
    view = OverlayFile(cf, "math")
    for name in ("w.a", "w.b", "w.c", EMB):
        assert np.array_equal(view.tensor(name), plain(cf, name, "math").astype(np.float32))
        assert view.resolve(name) == cf.resolve(name, "math")
        assert view.info(name) == cf.info(cf.resolve(name, "math"))   # stays mapped
        assert np.array_equal(view.raw(name), cf.raw(cf.resolve(name, "math")))
        assert view.tensors[name] == view.info(name)
    assert np.array_equal(view.tensor("w.a", skill="sql"), plain(cf, "w.a", "sql"))
    assert view.arch == cf.arch and EMB in view and "nope" not in view.tensors
    assert len(view.tensors) == len(cf.tensors) and set(view.tensors) == set(cf.tensors)
    with pytest.raises(KeyError):
        view.tensors["nope"]


def test_overlay_file_blend(cf):
    w = {"sql": 0.6, "math": 0.4}
    view = OverlayFile(cf, w)
    a = view.tensor("w.a")
    assert np.allclose(a, blend_ref(cf, "w.a", w), rtol=BLEND_RTOL, atol=1e-6)
    info = view.info("w.a")
    assert info.dtype == "f32" and info.shape == (4, H) and info.nbytes == 4 * 4 * H
    raw = view.raw("w.a")
    assert raw.dtype == np.uint8 and np.array_equal(raw.view(np.float32).reshape(4, H), a)
    a[:] = 0                                       # a caller's copy: the cache is unchanged
    assert np.array_equal(view.tensor("w.a"), raw.view(np.float32).reshape(4, H))
    assert not raw.flags.writeable
    # a name no listed skill replaces keeps its own record and payload
    assert view.info(EMB) == cf.info(EMB) and view.resolve("w.a") == "w.a"
    assert np.array_equal(view.raw(EMB), cf.raw(EMB))


def test_normalize_skill(cf):
    assert normalize_skill(cf, None) is None and normalize_skill(cf, "none") is None
    assert normalize_skill(cf, "sql") == "sql" and normalize_skill(cf, "plain") == "plain"
    assert normalize_skill(cf, "auto") == "auto"
    assert normalize_skill(cf, {"math": 1.0}) == "math"       # a one-skill blend of 1
    assert normalize_skill(cf, {"math": 1}) == "math"
    b = normalize_skill(cf, {"sql": 1, "math": 0.5})
    assert b == {"sql": 1.0, "math": 0.5} and all(type(v) is float for v in b.values())
    assert normalize_skill(cf, {"math": 0.5}) == {"math": 0.5}


@pytest.mark.parametrize("skill, match", [
    ("poetry", "skill='poetry'.*skills: math, plain, sql"),
    ({}, "empty blend"),
    ({"sql": 0.5, "poetry": 0.5}, "no skill 'poetry'"),
    ({"sql": -0.1}, "weight of 'sql'"),
    ({"sql": float("nan")}, "finite number"),
    ({"sql": float("inf")}, "finite number"),
    ({"sql": True}, "finite number"),
    ({"sql": "1"}, "finite number"),
    (3, "expected None, a skill id"),
    (["sql"], "expected None, a skill id"),
])
def test_normalize_skill_refuses(cf, skill, match):
    with pytest.raises(ConfigError, match=match):
        normalize_skill(cf, skill)


def test_auto_needs_a_selection(tmp_path):
    p = str(tmp_path / "nosel.cmf")
    t = _tensors(np.random.default_rng(1))
    arch = {"arch_name": "qwen3", "hidden_size": H, "intermediate_size": H, "num_layers": 1,
            "num_attention_heads": 1, "num_kv_heads": 1, "head_dim": H, "vocab_size": V,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-6}
    cmf.write(p, {**t, "skill.x.w.a": t["w.a"]}, arch=arch, quant="f32",
              skills=[{"id": "x"}], progress=False)
    with cmf.open(p) as f:
        with pytest.raises(ConfigError, match="skill='auto'.*no skill with a selection"):
            normalize_skill(f, "auto")
        no_embed = types.SimpleNamespace(      # its embedding goes by no known name
            path=f.path, tensors={k: v for k, v in f.tensors.items() if k != EMB})
        with pytest.raises(ConfigError, match="no embedding matrix"):
            mean_embedding(no_embed, [1])


# ---------------------------------------------------------------- routing

def ref_error(phi, mean, basis):
    r = np.asarray(phi, np.float64) - mean
    res = r - basis.T @ (basis @ r)
    return float(res @ res / (r @ r))


def test_router_reads_the_registry(cf, files):
    sel = files[3]
    router = SkillRouter(cf)
    assert [e[0] for e in router.entries] == ["sql", "math"] and router.layers == [0, 1]
    for sid, layer, mean, basis in router.entries:
        assert np.array_equal(mean, sel[sid][0]) and np.array_equal(basis, sel[sid][1])
        assert layer == (1 if sid == "sql" else 0)


@given(hnp.arrays(np.float64, H, elements=st.floats(-3, 3)),
       hnp.arrays(np.float64, H, elements=st.floats(-3, 3)))
def test_router_error_and_pick(files, phi0, phi1):
    sel = files[3]
    with cmf.open(files[0]["f32"]) as f:
        router = SkillRouter(f)
    phis = {0: phi0, 1: phi1}
    errs = router.errors(lambda layer: phis[layer])
    want = {}
    for sid, layer in (("sql", 1), ("math", 0)):
        r = phis[layer] - sel[sid][0]
        want[sid] = 0.0 if not r.any() else ref_error(phis[layer], *sel[sid])
        assert errs[sid] == pytest.approx(want[sid], rel=1e-9, abs=1e-12)
        assert 0.0 <= errs[sid] <= 1.0 + 1e-9     # a projection cannot add length
    assert router.pick(lambda layer: phis[layer]) == min(want, key=lambda k: (want[k], k))


def test_router_prefers_the_subspace_that_holds_phi(cf, files):
    sel = files[3]
    router = SkillRouter(cf)
    mean, basis = sel["math"]
    inside = mean + basis.T @ np.array([1.0, -2.0, 0.5])     # in math's home subspace
    # the stored basis is f16-rounded, orthonormal to ~1e-3: the residual is ~1e-6 of r
    assert router.error(inside, mean, basis) < 1e-6
    assert router.error(inside, *sel["sql"]) > 0.1
    assert router.pick(lambda layer: inside) == "math"
    assert router.error(sel["sql"][0], *sel["sql"]) == 0.0   # φ at the mean: r = 0


@pytest.mark.parametrize("sel, match", [
    ({"mean": "!!", "basis": "", "rank": 0}, r"selection.mean: not base64"),
    ({"mean": f16_b64(np.zeros(H - 1)), "basis": "", "rank": 0}, f"{H - 1} values, expected"),
    ({"mean": f16_b64(np.zeros(H)), "basis": "", "rank": -1}, "rank: expected an integer"),
    ({"mean": f16_b64(np.zeros(H)), "basis": "", "rank": True}, "rank: expected an integer"),
    ({"mean": f16_b64(np.zeros(H)), "basis": f16_b64(np.zeros(H)), "rank": 2},
     rf"basis: {H} values, expected {2 * H}"),
])
def test_router_refuses_bad_records(sel, match):
    fake = types.SimpleNamespace(path="x.cmf", arch={"hidden_size": H}, skills=[
        {"id": "s", "selection": {"metric": "mse", "phi_layer": 0, **sel}}])
    with pytest.raises(ConfigError, match=match):
        SkillRouter(fake)


# ---------------------------------------------------------------- mean embedding

@pytest.fixture(scope="module")
def embeddings(tmp_path_factory):
    """One file per embedding layout: rows cut out (f32, f16, bf16, q8_row, q4_block with
    whole groups per row) or the whole matrix decoded (q4_block with groups straddling
    rows, q8_2f)."""
    d = tmp_path_factory.mktemp("emb")
    rng = np.random.default_rng(9)
    out = {}
    for dtype, cols in [("f32", H), ("f16", H), ("bf16", H), ("q8_row", 40), ("q4_block", 64),
                        ("q4_block", 31), ("q8_2f", H)]:
        p = str(d / f"{dtype}_{cols}.cmf")
        arch = {"arch_name": "qwen3", "hidden_size": cols, "intermediate_size": cols,
                "num_layers": 1, "num_attention_heads": 1, "num_kv_heads": 1, "head_dim": cols,
                "vocab_size": V, "max_position_embeddings": 64, "rms_norm_eps": 1e-6}
        cmf.write(p, {EMB: rng.standard_normal((V, cols)).astype(np.float32)}, arch=arch,
                  quant="f32", dtypes={EMB: dtype}, progress=False)
        out[dtype, cols] = p
    return out


@pytest.mark.parametrize("layout", [("f32", H), ("f16", H), ("bf16", H), ("q8_row", 40),
                                    ("q4_block", 64), ("q4_block", 31), ("q8_2f", H)])
def test_mean_embedding(embeddings, layout):
    with cmf.open(embeddings[layout]) as f:
        assert f.info(EMB).dtype == layout[0]
        emb = f.tensor(EMB).astype(np.float64)
        for ids in ([3], [0, 0, 0], [5, 1, 5, V - 1, 7, 5], list(range(V))):
            want = emb[ids].mean(axis=0)
            got = mean_embedding(f, ids)
            assert got.dtype == np.float32 and got.shape == (layout[1],)
            assert np.allclose(got, want, rtol=1e-6, atol=1e-6), ids
