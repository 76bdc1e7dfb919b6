"""cortiq.runtime.sampling: SamplingParams validation and the Sampler chain (docs/runtime.md §2).

Tolerances:
* PROB_RTOL = 1e-12 -- the sampler works in float64; the references below compute the
  same softmax in float64 with the same operations up to summation order.
* EMPIRICAL_ATOL = 0.02 -- 20 000 draws from a distribution: a frequency's standard
  deviation is <= sqrt(0.25 / 20000) = 0.0035, so 0.02 is > 5 sigma.
"""
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortiq.errors import ConfigError
from cortiq.runtime.sampling import Sampler, SamplingParams

PROB_RTOL = 1e-12
EMPIRICAL_ATOL = 0.02

PLAIN = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)


def softmax64(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def logits_for(probs):
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


# ---------------------------------------------------------------- params

def test_defaults_are_upstreams():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty) == \
        (0.7, 40, 0.9, 0.05, 1.1)
    assert p.presence_penalty == p.frequency_penalty == 0.0
    assert p.logit_bias is None and p.suppress_tokens == () and p.seed is None
    g = SamplingParams.greedy(seed=3)
    assert g.is_greedy and g.repetition_penalty == 1.0 and g.seed == 3
    assert p.replace(top_k=5).top_k == 5 and p.top_k == 40
    assert p.to_dict()["top_p"] == 0.9


@pytest.mark.parametrize("field, value, msg", [
    ("temperature", -0.1, r"temperature: must be in \[0, inf\)"),
    ("temperature", float("nan"), "temperature: must be finite"),
    ("temperature", float("inf"), "temperature: must be finite"),
    ("temperature", "hot", "temperature: expected a number"),
    ("top_k", -1, "top_k: must be an integer >= 0"),
    ("top_k", 2.5, "top_k: must be an integer >= 0"),
    ("top_k", True, "top_k"),
    ("top_p", 1.5, r"top_p: must be in \[0, 1\]"),
    ("top_p", -0.01, r"top_p: must be in \[0, 1\]"),
    ("min_p", 2.0, r"min_p: must be in \[0, 1\]"),
    ("repetition_penalty", 0.0, r"repetition_penalty: must be in \(0, inf\)"),
    ("repetition_penalty", -1.0, r"repetition_penalty: must be in \(0, inf\)"),
    ("presence_penalty", 2.5, r"presence_penalty: must be in \[-2, 2\]"),
    ("frequency_penalty", -3, r"frequency_penalty: must be in \[-2, 2\]"),
    ("logit_bias", {5: 101}, r"logit_bias\[5\]: must be in \[-100, 100\]"),
    ("logit_bias", {-1: 1.0}, r"logit_bias: token ids must be integers >= 0"),
    ("logit_bias", {"abc": 1.0}, r"logit_bias: token id 'abc' is not an integer"),
    ("logit_bias", [1, 2], "logit_bias: expected a mapping"),
    ("suppress_tokens", [1, -2], "suppress_tokens: token ids must be integers >= 0"),
    ("suppress_tokens", 7, "suppress_tokens: expected a list"),
    ("seed", -2, r"seed: must be an integer in \[0, 2\*\*64\)"),
    ("seed", 2**64, r"seed: must be an integer in \[0, 2\*\*64\)"),
    ("seed", 1.5, "seed"),
])
def test_invalid_params_name_field_and_range(field, value, msg):
    with pytest.raises(ConfigError, match=msg):
        SamplingParams(**{field: value})
    assert issubclass(ConfigError, ValueError)


def test_param_normalisation():
    p = SamplingParams(logit_bias={"12": 3, 4: -2.5}, suppress_tokens=[5, 3, 5],
                       top_k=np.int64(3), seed=np.uint64(7))
    assert p.logit_bias == {12: 3.0, 4: -2.5}
    assert p.suppress_tokens == (3, 5)
    assert p.top_k == 3 and type(p.top_k) is int and p.seed == 7
    assert SamplingParams(logit_bias={}).logit_bias is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.top_k = 4                                  # frozen


def test_sampler_construction():
    s = Sampler(top_k=3, seed=1)
    assert s.params.top_k == 3
    s2 = Sampler(SamplingParams(seed=1), top_k=7)
    assert s2.params.top_k == 7 and s2.params.seed == 1
    with pytest.raises(TypeError):
        Sampler({"top_k": 3})
    with pytest.raises(ConfigError, match="top_p"):
        Sampler(top_p=3)


# ---------------------------------------------------------------- greedy

def test_greedy_argmax_and_ties_to_lower_index():
    s = Sampler(SamplingParams.greedy())
    z = np.array([0.1, 3.0, -1.0, 3.0, 2.9], dtype=np.float32)
    assert s.sample(z) == 1
    assert all(s.sample(z) == 1 for _ in range(20))
    p = s.probabilities(z)
    assert p[1] == 1.0 and p.sum() == 1.0
    assert Sampler(temperature=0.0, repetition_penalty=1.0).sample(np.zeros(9, np.float32)) == 0
    assert Sampler(temperature=5e-7).sample(z) == 1           # below the greedy threshold


def test_greedy_uses_penalised_logits():
    z = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    s = Sampler(SamplingParams.greedy(repetition_penalty=1.2))
    assert s.sample(z, history_ids=[]) == 0
    assert s.sample(z, history_ids=[0]) == 1                  # 2.0 / 1.2 < 1.9
    s = Sampler(SamplingParams.greedy(presence_penalty=0.5))
    assert s.sample(z, history_ids=[0]) == 1
    s = Sampler(SamplingParams.greedy(logit_bias={2: 5}))
    assert s.sample(z) == 2


# ---------------------------------------------------------------- penalties

def test_repetition_penalty_divides_positive_multiplies_negative():
    z = np.array([2.0, -1.0, 3.0, -2.0, 0.5], dtype=np.float32)
    s = Sampler(**{**PLAIN, "repetition_penalty": 2.0})
    got = s.probabilities(z, history_ids=[0, 1, 1, 1, 0])     # distinct ids count once
    want = softmax64([1.0, -2.0, 3.0, -2.0, 0.5])
    np.testing.assert_allclose(got, want, rtol=PROB_RTOL)
    # a penalty < 1 rewards instead
    got = Sampler(**{**PLAIN, "repetition_penalty": 0.5}).probabilities(z, [3])
    np.testing.assert_allclose(got, softmax64([2.0, -1.0, 3.0, -1.0, 0.5]), rtol=PROB_RTOL)


def test_presence_and_frequency_penalties_subtract():
    z = np.array([1.0, 1.0, 1.0, 1.0], dtype=np.float32)
    hist = np.array([0, 0, 0, 2], dtype=np.int32)             # numpy history is fine too
    got = Sampler(**PLAIN, presence_penalty=0.5, frequency_penalty=0.25).probabilities(z, hist)
    want = softmax64([1 - 0.5 - 0.75, 1.0, 1 - 0.5 - 0.25, 1.0])
    np.testing.assert_allclose(got, want, rtol=PROB_RTOL)
    got = Sampler(**PLAIN, presence_penalty=-1.0).probabilities(z, [1, 1])
    np.testing.assert_allclose(got, softmax64([1, 2, 1, 1]), rtol=PROB_RTOL)


def test_penalty_order_repetition_before_presence():
    z = np.array([4.0, 0.0], dtype=np.float32)
    s = Sampler(**{**PLAIN, "repetition_penalty": 2.0}, presence_penalty=1.0)
    got = s.probabilities(z, [0])
    np.testing.assert_allclose(got, softmax64([4.0 / 2 - 1.0, 0.0]), rtol=PROB_RTOL)


def test_no_penalties_ignores_history():
    z = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    s = Sampler(**PLAIN)
    np.testing.assert_array_equal(s.probabilities(z, [0, 1, 2]), s.probabilities(z))


# ---------------------------------------------------------------- bias / suppress

def test_logit_bias_adds_and_bans():
    z = np.zeros(6, dtype=np.float32)
    got = Sampler(**PLAIN, logit_bias={1: 1.0, "3": -2.0}).probabilities(z)
    np.testing.assert_allclose(got, softmax64([0, 1, 0, -2, 0, 0]), rtol=PROB_RTOL)
    s = Sampler(**{**PLAIN, "temperature": 0.8}, logit_bias={2: -100.0}, seed=0)
    assert 2 not in {s.sample(z) for _ in range(300)}
    s = Sampler(**PLAIN, logit_bias={4: 100.0}, seed=0)
    assert {s.sample(z) for _ in range(100)} == {4}
    with pytest.raises(ConfigError, match="logit_bias: token id 9 is outside"):
        Sampler(logit_bias={9: 1.0}).sample(z)


def test_suppress_tokens_never_chosen():
    z = np.array([5.0, 4.0, 0.0, 0.0], dtype=np.float32)
    s = Sampler(**PLAIN, suppress_tokens=[0, 17], seed=1)    # 17: beyond this vocab, ignored
    assert 0 not in {s.sample(z) for _ in range(300)}
    assert s.probabilities(z)[0] == 0.0
    assert Sampler(SamplingParams.greedy(suppress_tokens=[0])).sample(z) == 1


# ---------------------------------------------------------------- filters

def test_top_k_never_picks_outside_the_k_best():
    rng = np.random.default_rng(0)
    z = rng.standard_normal(1000).astype(np.float32)
    for k in (1, 2, 5, 40):
        best = set(np.argsort(-z)[:k].tolist())
        s = Sampler(**{**PLAIN, "top_k": k}, seed=k)
        picks = {s.sample(z) for _ in range(400)}
        assert picks <= best
        if k > 1:
            assert len(picks) > 1
        assert set(np.flatnonzero(s.probabilities(z)).tolist()) == best


def test_top_k_ties_at_threshold_survive():
    z = np.array([3.0, 1.0, 1.0, 1.0, 0.0], dtype=np.float32)
    got = Sampler(**{**PLAIN, "top_k": 2}).probabilities(z)
    assert np.flatnonzero(got).tolist() == [0, 1, 2, 3]
    assert Sampler(**{**PLAIN, "top_k": 10}).probabilities(z).all()   # k >= vocab: off


@pytest.mark.parametrize("top_p, kept", [
    (0.0, [0]), (0.3, [0]), (0.5, [0]), (0.7, [0, 1]), (0.85, [0, 1, 2]), (0.99, [0, 1, 2, 3]),
])
def test_top_p_shortest_prefix_reaching_p(top_p, kept):
    probs = [0.5, 0.3, 0.15, 0.05]
    perm = [2, 0, 3, 1]                                       # order in the vocab is arbitrary
    z = logits_for(probs)[perm]
    got = Sampler(**{**PLAIN, "top_p": top_p}).probabilities(z)
    kept_ids = sorted(perm.index(i) for i in kept)
    assert np.flatnonzero(got).tolist() == kept_ids
    want = np.zeros(4)
    for i in kept:
        want[perm.index(i)] = probs[i] / sum(probs[j] for j in kept)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("min_p, kept", [(0.0, 4), (0.2, 3), (0.5, 2), (0.7, 1), (1.0, 1)])
def test_min_p_excludes_below_fraction_of_max(min_p, kept):
    z = logits_for([0.5, 0.3, 0.15, 0.05])
    got = Sampler(**{**PLAIN, "min_p": min_p}).probabilities(z)
    assert np.flatnonzero(got).tolist() == list(range(kept))


def test_top_p_uses_unrenormalised_mass_after_top_k():
    # top-k=3 leaves 0.4, 0.3, 0.2 (sum 0.9). Upstream compares the raw cumulative sum
    # 0.4, 0.7, 0.9 with top_p = 0.75 -> keeps 3. (Renormalising first would keep 2.)
    z = logits_for([0.4, 0.3, 0.2, 0.1])
    got = Sampler(**{**PLAIN, "top_k": 3, "top_p": 0.75}).probabilities(z)
    assert np.flatnonzero(got).tolist() == [0, 1, 2]
    # min-p runs before top-p the same way: 0.1 < 0.4 * 0.3 is gone, the rest sum to 0.9
    got = Sampler(**{**PLAIN, "min_p": 0.3, "top_p": 0.95}).probabilities(z)
    assert np.flatnonzero(got).tolist() == [0, 1, 2]


def test_temperature_scales_before_softmax():
    rng = np.random.default_rng(1)
    z = rng.standard_normal(50).astype(np.float32)
    for t in (0.3, 1.0, 2.5):
        got = Sampler(**{**PLAIN, "temperature": t}).probabilities(z)
        np.testing.assert_allclose(got, softmax64(z.astype(np.float64) / t), rtol=1e-9)


def test_temperature_changes_which_tokens_survive_min_p():
    z = logits_for([0.6, 0.25, 0.15])
    cold = Sampler(**{**PLAIN, "temperature": 0.5, "min_p": 0.3}).probabilities(z)
    hot = Sampler(**{**PLAIN, "temperature": 2.0, "min_p": 0.3}).probabilities(z)
    assert np.count_nonzero(cold) == 1 and np.count_nonzero(hot) == 3


# ---------------------------------------------------------------- drawing

def test_seed_reproducibility():
    rng = np.random.default_rng(5)
    z = rng.standard_normal(500).astype(np.float32)
    hist = list(rng.integers(0, 500, 30))
    params = SamplingParams(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    a = Sampler(params)
    b = Sampler(params)
    seq_a = [a.sample(z, hist) for _ in range(60)]
    seq_b = [b.sample(z, hist) for _ in range(60)]
    assert seq_a == seq_b
    assert len(set(seq_a)) > 10
    c = Sampler(params.replace(seed=4321))
    assert [c.sample(z, hist) for _ in range(60)] != seq_a
    a.reseed(1234)
    assert [a.sample(z, hist) for _ in range(60)] == seq_a


def test_empirical_frequencies_match_probabilities():
    probs = np.array([0.1, 0.4, 0.2, 0.3])
    s = Sampler(**PLAIN, seed=99)
    z = logits_for(probs)
    draws = np.array([s.sample(z) for _ in range(20000)])
    freq = np.bincount(draws, minlength=4) / draws.size
    np.testing.assert_allclose(freq, probs, atol=EMPIRICAL_ATOL)


@given(st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=1, max_size=64),
       st.integers(0, 10), st.floats(0, 1), st.floats(0, 1), st.integers(0, 2**32))
def test_sample_is_always_in_the_support(vals, k, top_p, min_p, seed):
    z = np.asarray(vals, dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0.9, top_k=k, top_p=top_p, min_p=min_p, seed=seed,
                               repetition_penalty=1.0))
    p = s.probabilities(z)
    assert math.isclose(p.sum(), 1.0, rel_tol=1e-9) and (p >= 0).all()
    q = softmax64(z.astype(np.float64) / 0.9)
    assert p[int(np.argmax(q))] > 0                       # the most probable always survives
    for _ in range(5):
        t = s.sample(z)
        assert 0 <= t < z.size and p[t] > 0


# ---------------------------------------------------------------- inputs

def test_bad_inputs():
    s = Sampler(seed=0)
    with pytest.raises(ValueError, match="1-D"):
        s.sample(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="1-D"):
        s.sample(np.zeros(0, np.float32))
    with pytest.raises(TypeError, match="floating"):
        s.sample(np.arange(5))
    with pytest.raises(ValueError, match="history id 7 is outside"):
        s.sample(np.zeros(5, np.float32), [1, 7])
    with pytest.raises(TypeError, match="history_ids must be integers"):
        s.sample(np.zeros(5, np.float32), [1.5])
    with pytest.raises(ValueError, match="all NaN"):
        Sampler(SamplingParams.greedy()).sample(np.full(3, np.nan, np.float32))


def test_nan_and_inf_logits():
    z = np.array([np.nan, 1.0, 2.0, np.nan], dtype=np.float32)
    s = Sampler(**PLAIN, seed=0)
    assert {s.sample(z) for _ in range(100)} <= {1, 2}
    z = np.array([0.0, np.inf, 1.0, np.inf], dtype=np.float32)
    assert {s.sample(z) for _ in range(100)} == {1, 3}
    assert Sampler(SamplingParams.greedy()).sample(z) == 1
    z = np.full(4, -np.inf, np.float32)
    assert s.sample(z) == 0                                 # nothing survives: raw argmax
    assert s.probabilities(z)[0] == 1.0


def test_large_vocab_full_chain():
    """The whole chain on a 152k vocabulary with a long history: every draw lies in the
    support of `probabilities`, and a seed repeats the draws. (Its speed is a
    benchmark: benchmarks/bench_sampling.py.)"""
    rng = np.random.default_rng(0)
    z = rng.standard_normal(152_064).astype(np.float32) * 3
    hist = rng.integers(0, z.size, 2000)
    params = SamplingParams(temperature=0.8, top_k=0, top_p=0.95, min_p=0.0,
                            repetition_penalty=1.1, presence_penalty=0.2,
                            frequency_penalty=0.1, seed=0)
    draws = [Sampler(params).sample(z, hist) for _ in range(2)]
    s = Sampler(params)
    more = [s.sample(z, hist) for _ in range(10)]
    assert draws[0] == draws[1] == more[0]
    p = s.probabilities(z, hist)
    assert all(p[t] > 0 for t in more)
    assert len(set(more)) > 1
