"""`python -m app bench --concurrency 1,2,4,8`: N streaming clients at once against a real server, drafting
on and off, at each level: aggregate tok/s, time to first token (p50, p95) and the speculation gain.

The server is the engine process itself (`serve`, started here with the bench's model flags and ended with
it; or the one at --url). Every client of a run sends one streamed chat request at the same moment, the
n-th client the n-th prompt of the set (round robin); a run's aggregate tok/s is the tokens all of its
streams generated over the run's wall time. Each level runs both sides `repeat` times, alternating (plain,
drafted, drafted, plain, ...) so that a drift of the machine's speed falls on both; every figure reported
is the median over the runs, and the gain is the drafted side's median tok/s over the plain side's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import httpx

from app.config import Settings, overrides_from_args

API_KEY_ENV = "FORESIGHT_API_KEY"  # a running engine's key, for --url
READY_TIMEOUT_S = 600.0  # a cold start loads the model (and may build its caches)
REQUEST_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 15.0
SIDES = ("plain", "drafted")


@dataclass(frozen=True)
class StreamResult:
    """One streamed request: tokens generated, seconds to the first content and to the end, or its error."""

    tokens: int
    ttft_s: float | None
    total_s: float
    error: str | None = None


@dataclass(frozen=True)
class Run:
    """One run of a level: its streams, all started at once, and the wall time until the last ended."""

    streams: list[StreamResult]
    wall_s: float

    @property
    def ok(self) -> list[StreamResult]:
        return [s for s in self.streams if s.error is None]

    @property
    def tok_s(self) -> float:
        return sum(s.tokens for s in self.ok) / self.wall_s if self.wall_s else 0.0

    def ttft(self, q: float) -> float | None:
        """The q-quantile of the streams' times to first token (nearest rank)."""
        times = sorted(s.ttft_s for s in self.ok if s.ttft_s is not None)
        return times[max(0, round(q * len(times)) - 1)] if times else None


def parse_levels(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]; each level a positive number of streams."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"--concurrency: comma-separated numbers of streams, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise SystemExit(f"--concurrency: each level at least 1 stream, got {text!r}")
    return levels


def stream_once(
    http: httpx.Client, messages: list[dict[str, Any]], tokens: int, drafted: bool
) -> StreamResult:
    """One streamed chat completion at temperature 0; the token count is the final usage chunk's."""
    body = {
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "speculative": drafted,
    }
    t0 = time.perf_counter()
    ttft, generated = None, 0
    try:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                return StreamResult(
                    0, None, time.perf_counter() - t0, f"HTTP {response.status_code}: {response.text}"
                )
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    return StreamResult(generated, ttft, time.perf_counter() - t0, event["error"]["message"])
                if ttft is None and any(c.get("delta", {}).get("content") for c in event["choices"]):
                    ttft = time.perf_counter() - t0
                if event.get("usage"):
                    generated = event["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        return StreamResult(generated, ttft, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}")
    return StreamResult(generated, ttft, time.perf_counter() - t0)


def run_level(
    url: str, headers: dict[str, str], prompts: list[dict[str, Any]], n: int, tokens: int, drafted: bool
) -> Run:
    """n streams started together (each client its own connection), timed until the last one ends."""
    results: list[StreamResult | None] = [None] * n
    gate = threading.Barrier(n + 1)

    def client(i: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S) as http:
            gate.wait()
            results[i] = stream_once(http, prompts[i % len(prompts)]["messages"], tokens, drafted)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    gate.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t0
    return Run(
        [r if r is not None else StreamResult(0, None, 0.0, "the client thread failed") for r in results],
        wall,
    )


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def side_report(runs: list[Run]) -> dict[str, Any]:
    """One side of a level: medians over its runs, with each run's figures."""
    tok_s = [run.tok_s for run in runs]
    return {
        "tok_s": round(statistics.median(tok_s), 2),
        "ttft_p50_s": _rounded(_median([run.ttft(0.5) for run in runs])),
        "ttft_p95_s": _rounded(_median([run.ttft(0.95) for run in runs])),
        "requests": sum(len(run.streams) for run in runs),
        "completed": sum(len(run.ok) for run in runs),
        "tokens": sum(s.tokens for run in runs for s in run.ok),
        "errors": [s.error for run in runs for s in run.streams if s.error is not None],
        "tok_s_runs": [round(x, 2) for x in tok_s],
    }


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def bench_level(
    url: str, headers: dict[str, str], prompts: list[dict[str, Any]], n: int, tokens: int, repeat: int
) -> dict[str, Any]:
    """Both sides of one level, `repeat` runs each in alternating order."""
    runs: dict[str, list[Run]] = {side: [] for side in SIDES}
    for i in range(repeat):
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:
            runs[side].append(run_level(url, headers, prompts, n, tokens, drafted=side == "drafted"))
    report = {"concurrency": n, "runs": repeat, **{side: side_report(runs[side]) for side in SIDES}}
    plain = report["plain"]["tok_s"]
    report["gain"] = round(report["drafted"]["tok_s"] / plain, 3) if plain else None
    return report


def format_row(level: dict[str, Any]) -> str:
    def ttft(side: dict[str, Any]) -> str:
        p50, p95 = side["ttft_p50_s"], side["ttft_p95_s"]
        return "-" if p50 is None else f"{p50:.3f}/{p95:.3f}"

    plain, drafted = level["plain"], level["drafted"]
    errors = len(plain["errors"]) + len(drafted["errors"])
    gain = "-" if level["gain"] is None else f"{level['gain']:.2f}x"
    return (
        f"{level['concurrency']:>7} {plain['tok_s']:>10.1f} {drafted['tok_s']:>10.1f} {gain:>6} "
        f"{ttft(plain):>17} {ttft(drafted):>17} {errors:>6}"
    )


HEADER = (
    f"{'streams':>7} {'plain t/s':>10} {'draft t/s':>10} {'gain':>6} "
    f"{'plain TTFT p50/95':>17} {'draft TTFT p50/95':>17} {'errors':>6}"
)


def run(
    url: str,
    headers: dict[str, str],
    prompts: list[dict[str, Any]],
    levels: list[int],
    tokens: int,
    repeat: int,
    as_json: bool,
) -> list[dict[str, Any]]:
    """The whole bench against a serving engine: a warm-up, then every level; prints as it goes."""
    with httpx.Client(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S) as http:
        for drafted in (False, True):  # untimed: first-use costs must not land on the first level
            stream_once(http, prompts[0]["messages"], min(tokens, 8), drafted)
    if not as_json:
        print(HEADER, flush=True)
        print("-" * len(HEADER), flush=True)
    reports = []
    for n in levels:
        level = bench_level(url, headers, prompts, n, tokens, repeat)
        reports.append(level)
        print(json.dumps(level) if as_json else format_row(level), flush=True)
    if as_json:
        gains = {str(level["concurrency"]): level["gain"] for level in reports}
        print(json.dumps({"summary": {"levels": levels, "gain": gains}, "props": server_props(url, headers)}))
    else:
        print(f"\neach side ran {repeat} times per level, alternating; medians are reported; "
              f"{tokens} tokens at most per stream")  # fmt: skip
        for level in reports:
            for side in SIDES:
                for error in level[side]["errors"][:3]:
                    print(f"error at {level['concurrency']} streams ({side}): {error}")
    return reports


def server_props(url: str, headers: dict[str, str]) -> dict[str, Any] | None:
    """The engine's /props (None where the listener does not show them: a public one)."""
    response = httpx.get(f"{url}/props", headers=headers, timeout=30)
    return response.json() if response.status_code == 200 else None


def main(args: argparse.Namespace, prompts: list[dict[str, Any]], settings: Settings) -> int:
    """The bench against --url, or against an engine process started here with the bench's model flags."""
    levels = parse_levels(args.concurrency)
    if args.url:
        key = os.environ.get(API_KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        run(args.url.rstrip("/"), headers, prompts, levels, args.tokens, args.repeat, args.json)
        return 0
    if args.no_draft:
        raise SystemExit("--concurrency compares drafting on and off: --no-draft leaves nothing to compare")
    flags = ["--target", args.target, *(["--draft", args.draft] if args.draft else ["--ngram"])]
    overrides = overrides_from_args(args)
    room = max(levels)  # every stream of a level comes from this one client, on loopback
    overrides["server"] = {
        "host": "127.0.0.1",
        "per_client": max(room, settings.server.per_client),
        "queue_size": max(room, settings.server.queue_size),
    }
    with engine_process(flags, overrides) as url:
        run(url, {}, prompts, levels, args.tokens, args.repeat, args.json)
    return 0


# --- the server -------------------------------------------------------------------------------------
def serve_argv(model_flags: list[str]) -> list[str]:
    """The engine process's command line; it ends with this one (--parent-pid)."""
    command = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "app"]
    return [*command, "serve", *model_flags, "--port", "0", "--parent-pid", str(os.getpid())]


def settings_env(overrides: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Settings as FORESIGHT_SECTION__FIELD variables, the way the engine process reads them."""
    out = {}
    for section, fields in overrides.items():
        for name, value in fields.items():
            if isinstance(value, list):
                value = ",".join(str(v) for v in value)
            elif isinstance(value, bool):
                value = "true" if value else "false"
            out[f"FORESIGHT_{section.upper()}__{name.upper()}"] = str(value)
    return out


def _wait_ready(proc: subprocess.Popen[str], log: IO[str]) -> int:
    assert proc.stdout is not None
    lines: list[str] = []

    def read() -> None:
        lines.extend(iter(proc.stdout.readline, ""))  # type: ignore[union-attr]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        ready = next((line for line in lines if line.startswith("READY port=")), None)
        if ready is not None:
            return int(ready.strip().split("=", 1)[1])
        time.sleep(0.1)
    log.seek(0)
    tail = "".join(log.readlines()[-20:])
    raise SystemExit(f"the engine process did not become ready (exit {proc.poll()}):\n{tail}")


@contextmanager
def engine_process(model_flags: list[str], overrides: dict[str, dict[str, Any]]) -> Iterator[str]:
    """A `serve` process on an OS-chosen loopback port; yields its URL; always ended on exit."""
    env = {**os.environ, **settings_env(overrides)}
    env.pop(API_KEY_ENV, None)
    env.pop("FORESIGHT_ADMIN_TOKEN", None)
    with tempfile.TemporaryFile("w+", encoding="utf-8") as log:
        proc = subprocess.Popen(
            serve_argv(model_flags),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        try:
            yield f"http://127.0.0.1:{_wait_ready(proc, log)}"
        finally:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
