"""The kernel thread pool: every parallel kernel family gives bit-identical results for
any thread count and from any calling thread (the main thread, a ThreadPoolExecutor
worker, a fresh threading.Thread, many Python threads at once); the pool resizes while
idle; a forked child still computes, with a pool of its own.

Each family's reference is its result with one kernel thread on the main thread, and
the shapes are large enough for every kernel to take its parallel path (each has a
work threshold below which it stays on the caller)."""
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import cortiq
from cortiq.kernels import _kernels as K
from cortiq.kernels.tensor import QTensor
from cortiq.cmf.testing import qtensor_from_f32

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cortiq.__file__)))


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    d = {"x": f(512), "X": f(37, 512), "mats": {}}
    for dtype in ("f32", "f16", "bf16", "q8_row", "q8_2f", "q4_block", "q4_tiled", "q4tp", "q2tp"):
        d["mats"][dtype] = qtensor_from_f32(f(389, 512), dtype)
    d["q"], d["keys"], d["vals"] = f(5, 8, 64), f(300, 2, 64), f(300, 2, 64)
    d["sq"], d["kv"] = f(16, 64), f(400, 64)
    d["idx"] = rng.integers(-1, 400, 300).astype(np.int64)
    d["sink"] = f(16)
    d["hx"], d["hfn"] = f(4, 1024), f(24, 4096)
    d["grouped"] = qtensor_from_f32(f(8 * 200, 64), "q8_row")
    d["gx"] = f(8 * 64)
    d["sum_mats"] = [qtensor_from_f32(f(300, 128), "q8_row") for _ in range(3)]
    d["sum_xs"] = [f(128) for _ in range(3)]
    d["w_quant"] = f(300, 256)
    for dtype in ("q8_row", "q4_block", "q4tp", "q2tp"):  # int8 activations
        d["mats"][f"{dtype} int8"] = qtensor_from_f32(f(389, 512), dtype, precision="int8")
    return d


def _compute(d):
    """Every parallel kernel family once; a dict of named results."""
    out = {}
    for dtype, m in d["mats"].items():
        out[f"matvec {dtype}"] = m.matvec(d["x"])
        out[f"matmat {dtype}"] = m.matmat(d["X"])
        out[f"dequant {dtype}"] = m.dequantize()
    many = QTensor.matvec_many(list(d["mats"].values()), d["x"])
    for i, y in enumerate(many):
        out[f"matvec_many {i}"] = y
    out["attn_gqa"] = K.attn_gqa_window(d["q"], d["keys"], d["vals"], pos0=295, window=0)
    out["attn_gqa window"] = K.attn_gqa_window(d["q"], d["keys"], d["vals"], pos0=295, window=40)
    out["sparse_attend"] = K.sparse_attend(d["sq"], d["kv"], d["idx"], sink=d["sink"])
    out["hc_mixes"] = K.hc_mixes(d["hx"], d["hfn"], 1e-6)
    out["grouped_rows"] = K.grouped_rows(d["grouped"], d["gx"], 8)
    out["rows_sum"] = K.rows_sum(d["sum_mats"], d["sum_xs"])
    out["q8_row"] = np.asarray(K.quantize_q8_row(d["w_quant"]))
    out["q8_2f"] = np.asarray(K.quantize_q8_2f(d["w_quant"]))
    out["q4_block"] = np.asarray(K.quantize_q4_block(d["w_quant"]))
    return out


def _assert_same(got, ref):
    assert got.keys() == ref.keys()
    for k in ref:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(ref[k]), err_msg=k)


@pytest.fixture(scope="module")
def data():
    return _inputs()


@pytest.fixture
def keep_threads():
    before = cortiq.get_num_threads()
    yield
    cortiq.set_num_threads(before)


@pytest.fixture(scope="module")
def reference(data):
    before = cortiq.get_num_threads()
    cortiq.set_num_threads(1)
    try:
        return _compute(data)
    finally:
        cortiq.set_num_threads(before)


def _in_fresh_thread(fn):
    box = []
    th = threading.Thread(target=lambda: box.append(fn()))
    th.start()
    th.join()
    return box[0]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_any_thread_count_and_calling_thread(isa, data, keep_threads, n):
    before = cortiq.get_num_threads()
    cortiq.set_num_threads(1)
    ref = _compute(data)  # this ISA's reference
    cortiq.set_num_threads(n)
    _assert_same(_compute(data), ref)                    # main thread
    with ThreadPoolExecutor(2) as ex:                    # executor workers, twice
        _assert_same(ex.submit(_compute, data).result(), ref)
        _assert_same(ex.submit(_compute, data).result(), ref)
    _assert_same(_in_fresh_thread(lambda: _compute(data)), ref)
    _assert_same(_compute(data), ref)                    # main thread again after them
    cortiq.set_num_threads(before)


def test_many_python_threads_at_once(data, reference, keep_threads):
    """Eight Python threads call every family at once (two rounds each): no crash, no
    deadlock, every result equal to the serial one."""
    cortiq.set_num_threads(2)
    errors = []
    start = threading.Barrier(8)

    def hammer():
        try:
            start.wait(timeout=60)
            for _ in range(2):
                _assert_same(_compute(data), reference)
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a kernel call did not return (deadlock)"
    assert not errors, errors[0]


def test_resize_while_idle(data, reference, keep_threads):
    m = data["mats"]["q8_row"]
    for n in (4, 1, 3, 2):
        cortiq.set_num_threads(n)
        np.testing.assert_array_equal(m.matvec(data["x"]), reference["matvec q8_row"])
        assert K.pool_workers() == n - 1  # started or stopped by that parallel call
        assert cortiq.config()["pool"] == {"threads": n, "workers": n - 1,
                                           "spin_us": K.pool_spin_us(), "stalls": K.pool_stalls()}


def test_spin_setting(data, reference, keep_threads):
    before = K.pool_spin_us()
    try:
        cortiq.set_num_threads(2)
        for us in (0, 5, 200):  # 0: workers sleep between calls at once
            K.set_pool_spin_us(us)
            assert K.pool_spin_us() == us
            _assert_same(_compute(data), reference)
        with pytest.raises(ValueError):
            K.set_pool_spin_us(-1)
    finally:
        K.set_pool_spin_us(before)


def _run(code, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTIQ_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, cwd=PKG_PARENT, check=False)


FORK_CHILD = """
import os, sys, numpy as np, cortiq
from cortiq.kernels.tensor import QTensor
from cortiq.cmf.testing import qtensor_from_f32
cortiq.set_num_threads(2)
rng = np.random.default_rng(0)
m = qtensor_from_f32(rng.standard_normal((2048, 512)).astype(np.float32), "q8_row")
x = rng.standard_normal(512).astype(np.float32)
y = m.matvec(x)                       # the parent's pool has started its worker
pid = os.fork()
if pid == 0:
    ok = all(np.array_equal(m.matvec(x), y) for _ in range(20))
    os._exit(0 if ok and cortiq.kernels._kernels.pool_workers() == 1 else 3)
_, status = os.waitpid(pid, 0)
assert np.array_equal(m.matvec(x), y)  # the parent's pool still works
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_fork_after_use():
    r = _run(FORK_CHILD)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["child", "0"]


def test_spin_env():
    r = _run("import cortiq; print(cortiq.config()['pool']['spin_us'])", {"CORTIQ_SPIN_US": "7"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "7"
    r = _run("import cortiq", {"CORTIQ_SPIN_US": "soon"})
    assert r.returncode != 0 and "CORTIQ_SPIN_US" in r.stderr


def test_show_config_reports_the_pool(capsys, keep_threads):
    cortiq.set_num_threads(2)
    cortiq.show_config()
    out = capsys.readouterr().out
    assert "threads:      2  (the caller + 1 pool workers" in out
    assert f"idle workers spin {K.pool_spin_us()} us, then sleep" in out


def test_idle_pool_sleeps(data, keep_threads):
    """Once calls stop, the workers spin for at most the spin budget and then sleep: an
    idle process uses (next to) no CPU."""
    cortiq.set_num_threads(3)
    m = data["mats"]["q8_row"]
    for _ in range(20):
        m.matvec(data["x"])
    assert K.pool_workers() == 2
    time.sleep(0.05)  # past the spin budget (CORTIQ_SPIN_US, 200 us by default)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(0.5)
    used = time.process_time() - cpu0
    # Measured: 0.0002 s idle, 0.0001 s with 2 and with 4 busy loops on the 2 cores; a
    # worker still spinning would use ~0.5 s per worker.
    assert used < 0.05, f"{used:.3f} s of CPU in {time.perf_counter() - wall0:.2f} s idle"


def test_model_logits_any_thread(keep_threads):
    """A whole decode (the demo Dory: fused row kernels, attention, head) gives the same
    logits bit for bit at any thread count, from the main thread or a worker."""
    llm = cortiq.LLM(seed=0)
    ids = llm.tokenize("Return a sorted list of the items")

    def run():
        s = llm.session()
        rows = [s.feed(ids[:-3], want="last")]
        rows += [s.feed([i], want="last") for i in ids[-3:]]  # one-row decode steps
        return np.stack(rows)

    cortiq.set_num_threads(1)
    ref = run()
    for n in (2, 3):
        cortiq.set_num_threads(n)
        np.testing.assert_array_equal(run(), ref)
        with ThreadPoolExecutor(1) as ex:
            np.testing.assert_array_equal(ex.submit(run).result(), ref)
