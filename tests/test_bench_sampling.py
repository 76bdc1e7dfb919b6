"""benchmarks/bench_sampling.py runs end to end on a small vocabulary and prints one row
per vocabulary with its three figures (speed lives in the benchmark, not in tests)."""
import re
import subprocess
import sys
from pathlib import Path

import optional

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_sampling.py"


def test_one_row_per_vocabulary():
    optional.need_that("source", BENCH.exists(), "benchmarks/ is not next to the tests")
    r = subprocess.run([sys.executable, str(BENCH), "--repeat", "2", "--vocab", "500", "3000"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:] if line.strip()]
    assert [row[0] for row in rows] == ["500", "3000"], r.stdout
    for row in rows:
        assert len(row) == 4 and all(re.fullmatch(r"\d+\.\d+", v) for v in row[1:]), row
        assert float(row[1]) > 0, row
