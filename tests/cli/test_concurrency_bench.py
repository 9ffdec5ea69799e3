"""`bench --concurrency`: the real engine process on gemma-3-270m, streams at once, drafting on and off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from app.cli.concurrency import SIDES, parse_levels, settings_env

ROOT = Path(__file__).resolve().parents[2]
LEVELS, REPEAT, TOKENS = (1, 3), 2, 8


def test_bench_concurrency_reports_every_level_and_side(gemma_path: Path) -> None:
    model = ["--target", str(gemma_path), "--n-ctx", "1024", "--n-threads", "1"]
    levels = ["--concurrency", ",".join(map(str, LEVELS)), "--repeat", str(REPEAT), "--tokens", str(TOKENS)]
    argv = [sys.executable, "-m", "app", "bench", *model, *levels, "--only", "chat-tcp-udp", "--json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    *levels, summary = lines
    assert [level["concurrency"] for level in levels] == list(LEVELS)
    for level in levels:
        n = level["concurrency"]
        assert level["runs"] == REPEAT
        for side in SIDES:
            report = level[side]
            assert report["requests"] == report["completed"] == n * REPEAT, report["errors"]
            assert report["errors"] == []
            assert len(report["tok_s_runs"]) == REPEAT
            assert 0 < report["tokens"] <= n * REPEAT * TOKENS
            assert report["tok_s"] > 0
            assert report["ttft_p50_s"] is not None
            assert report["ttft_p95_s"] >= report["ttft_p50_s"]
        assert level["gain"] == round(level["drafted"]["tok_s"] / level["plain"]["tok_s"], 3)
    assert summary["summary"]["levels"] == list(LEVELS)
    assert set(summary["summary"]["gain"]) == {str(n) for n in LEVELS}
    assert summary["props"]["draft"]["source"]  # the engine it started, as it described itself
    assert summary["props"]["server"]["per_client"] >= max(LEVELS)
    print("\n" + "\n".join(json.dumps({k: level[k] for k in ("concurrency", "gain")}) for level in levels))


def test_levels_and_the_engine_settings_it_passes() -> None:
    assert parse_levels("1,2, 4,8") == [1, 2, 4, 8]
    env = settings_env({"engine": {"n_ctx": 1024, "tensor_split": [0.5, 0.5]}, "draft": {"adaptive": False}})
    assert env == {
        "FORESIGHT_ENGINE__N_CTX": "1024",
        "FORESIGHT_ENGINE__TENSOR_SPLIT": "0.5,0.5",
        "FORESIGHT_DRAFT__ADAPTIVE": "false",
    }
