"""benchmarks/bench_soak.py, short: 120 mixed requests (chat and completions, streamed
and not, json_schema, tools, logprobs, embeddings, streams closed early, invalid
requests) from 8 concurrent OpenAI clients against a `cortiq serve` subprocess on the
demo model. Each check is asserted here from the report's raw figures, not from its
verdicts."""
import json
import subprocess
import sys
from pathlib import Path

import optional

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_soak.py"
optional.need("extras", "openai", "httpx", "starlette", "uvicorn", "prometheus_client")

# RSS growth allowed between the warm-up sample (after 12 requests) and the end. A short
# run is still warming up after 12 requests (allocator arenas, worker threads' stacks,
# idle KV sessions up to --max-sessions, first-touched weight pages), so 5 % would fail
# on noise; 25 % of the demo server's ~100 MiB still catches a leak of ~200 KiB per
# request. Small leaks are the long run's job (5000 requests, 5 %).
SHORT_RUN_RSS_GROWTH = 0.25


def test_short_soak_against_a_server_process():
    optional.need_that("source", BENCH.exists(), "benchmarks/ is not next to the tests")
    r = subprocess.run([sys.executable, str(BENCH), "--requests", "120", "--clients", "8",
                        "--rss-growth", str(SHORT_RUN_RSS_GROWTH), "--json"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.stdout.strip(), r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["requests"] == 120
    assert report["n_unexpected"] == 0, report["unexpected"]
    kinds = report["by_kind"]
    for kind in ("chat_stream", "completion", "json_schema", "tools", "logprobs",
                 "embeddings", "cancelled_stream", "bad_temperature", "bad_json"):
        assert kinds.get(kind, 0) > 0, kinds
    warm, end = report["samples"]["warm-up"], report["samples"]["end"]
    assert end["rss_bytes"] <= warm["rss_bytes"] * (1 + SHORT_RUN_RSS_GROWTH)
    assert end["fds"] <= warm["fds"] + 8          # a reconnect per client at most
    assert end["threads"] <= warm["threads"] + 4
    for route_status, (clients, metrics) in report["requests_by_route_status"].items():
        assert clients == metrics, route_status
    assert "/v1/completions 404" in report["requests_by_route_status"]
    assert report["tokens_metrics"] == report["tokens_clients"]
    assert report["tokens_clients"]["completion_tokens"] > 0
    assert report["ttft_s"]["p50"] is not None and report["per_token_s"]["p50"] is not None
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
