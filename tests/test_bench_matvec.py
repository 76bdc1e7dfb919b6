"""benchmarks/bench_matvec.py runs end to end on a toy shape and prints every section.

The benchmark is the proof of the matvec speed claims (docs/PERFORMANCE.md), so it must
not rot: this runs it on a shape small enough for a second or two and checks what it
prints, not how fast anything is (speed lives in the benchmark itself, not in tests)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_matvec.py"


@pytest.fixture(scope="module")
def output():
    r = subprocess.run([sys.executable, str(BENCH), "--shapes", "96x64", "--gib", "0.002", "--reps", "1",
                        "--threads", "1,2", "--dtypes", "q8_row,q4_block,q4tp+i8,q8_row+i8", "--no-numpy"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_every_section_printed(output):
    for head in ("(a) read bandwidth", "(b) cortiq matvec", "(d) prefill", "(e) int8 activations",
                 "(f) ceilings", "(g) Markdown table"):
        assert head in output, head


def test_rows_per_dtype_and_thread(output):
    for dt in ("q8_row", "q4_block", "q4tp+i8"):
        row = next(line for line in output.splitlines() if line.split()[:2] == [dt, "96x64"])
        assert len(re.findall(r"\[\s*\d+\.\d\]", row)) == 2, row  # one read reference per thread count
        ceil = next(line for line in output.splitlines()
                    if line.split()[:1] == [dt] and "thr" in line and "96x64" not in line)
        assert len(re.findall(r"\d thr\s+\d+\.\d \[bound\s+\d+%\]", ceil)) == 2, ceil


def test_prefill_reports_what_3x_takes(output):
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("(d) prefill"))
    rows = {line.split()[0]: line.split() for line in lines[start:start + 10]
            if line.split()[:1] in (["q8_row"], ["q4_block"], ["q8_row+i8"]) and "exact" not in line}
    assert set(rows) == {"q8_row", "q4_block", "q8_row+i8"}
    for f in rows.values():
        ratio, mm, mv, need = float(f[1].rstrip("x")), float(f[-3]), float(f[-2]), float(f[-1])
        assert mm > 0 and mv > 0
        assert need == pytest.approx(3 * mv, abs=0.2)  # 3x the matvecs (each printed to 0.1)
        # the three printed with 2, 1 and 1 decimals: within their rounding
        assert abs(ratio - mm / mv) <= 0.005 + (mm / mv) * (0.05 / mm + 0.05 / mv) + 1e-9


def test_int8_matmat_beside_exact(output):
    """(d) puts each '+i8' dtype's int8 matmat beside the exact one of the same weights."""
    line = next(line for line in output.splitlines() if line.split()[:2] == ["q8_row", "exact"])
    f = line.split()
    exact, int8, ratio = float(f[2]), float(f[4]), float(f[6].rstrip("x"))
    assert exact > 0 and int8 > 0 and "target >= 2.5x" in line
    assert abs(ratio - int8 / exact) <= 0.005 + (int8 / exact) * (0.05 / int8 + 0.05 / exact) + 1e-9


def test_markdown_table_has_a_row_per_matvec(output):
    """(g): one Markdown row per dtype of (b), a cell per thread count, with the table's name."""
    rows = [line for line in output.splitlines() if line.startswith("| ") and "96x64" in line]
    assert sorted(r.split(" | ")[1] for r in rows) == sorted(["q8_row", "q4_block", "q4tp+i8", "q8_row+i8"])
    for r in rows:
        assert r.split(" | ")[0] in ("| avx512", "| avx2", "| ref", "| neon", "| neon_dotprod"), r
        assert len(re.findall(r"\d+\.\d \(\d+ %\) \[\d+\.\d\]", r)) == 2, r
