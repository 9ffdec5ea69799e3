#!/usr/bin/env bash
# Issue 26 on the lent GPU machine (../shared/GPU.md), in one batch: the target on the GPU directly and
# through a loopback RPC worker that serves the same GPU (rpc-worker --device gpu), tok/s side by side:
# what the RPC hop costs per token; and n-gram speculation with the target through the worker.
# It expects what gpu-issue20.sh expects: llama-cpp-python (CUDA) installed with
# `scripts/llama_build.py install --target $SITE` (default /root/gpu/site), gemma-3-270m and the default
# model assembled under /root/gpu (or /root/gpu/models). The rpc-server build needs the llama-cpp-python
# sdist (SDIST=..., else ~/.cache/foresight/sdist or /root/gpu) and cmake (on PATH, or the `cmake` wheel
# among the carried ones: FIND_LINKS=dir). Results land in $OUT as small text and JSON files.
#   gpu-rpc.sh [all]     everything below, in this order (about 10 minutes; TOKENS=128 REPEAT=3)
#   gpu-rpc.sh build     rpc-server for the installed wheel, beside its backends   -> build-rpc.txt
#   gpu-rpc.sh devices   a worker on the GPU; devices --rpc sees it                 -> devices-rpc.json
#   gpu-rpc.sh plain     bench --no-draft, direct vs through the worker, gemma and the default model
#                                                                    -> bench-rpc-{gemma,qwen}.{jsonl,txt}
#   gpu-rpc.sh ngram     plain vs n-gram with the default model's layers all on the worker -> bench-rpc-ngram.txt
#   gpu-rpc.sh tests     the loopback tests of issue 26 on this machine's build      -> pytest-rpc.txt
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=/root/gpu
SITE=${SITE:-$G/site}
export PYTHONPATH=$SITE:$PWD
export FORESIGHT_HOME=${FORESIGHT_HOME:-/root/foresight-home-issue26}
TOKENS=${TOKENS:-128}
REPEAT=${REPEAT:-3}
# every layer on the worker's device: with RPC workers joined, llama.cpp lists their devices first
THROUGH=(--device gpu --tensor-split 1,0 --backend llama)

model() {  # the assembled file of that name, wherever the stash put it
  for f in "$G/models/$1" "$G/$1"; do [ -f "$f" ] && { echo "$f"; return 0; }; done
  echo "missing: $1" >&2; return 1
}
GEMMA=$(model gemma-3-270m-q4_k_m.gguf 2>/dev/null) && export FORESIGHT_TEST_GEMMA=$GEMMA
QWEN=$(model qwen2.5-coder-1.5b-instruct-q4_k_m.gguf 2>/dev/null) && export FORESIGHT_TEST_QWEN=$QWEN

WORKER_PID=""
worker() {  # a worker on the GPU, on loopback; sets ADDR
  [ -n "$WORKER_PID" ] && kill -0 "$WORKER_PID" 2>/dev/null && return 0
  python3 -m app rpc-worker --device gpu --port 0 > "$OUT/worker.log" 2>&1 &
  WORKER_PID=$!
  for _ in $(seq 1 600); do  # at most 60 s: it loads the CUDA backend first
    grep -q '^READY rpc=' "$OUT/worker.log" && break
    kill -0 "$WORKER_PID" 2>/dev/null || break
    sleep 0.1
  done
  ADDR=$(sed -n 's/^READY rpc=//p' "$OUT/worker.log")
  [ -n "$ADDR" ] || { echo "the worker did not start:"; tail -n 8 "$OUT/worker.log"; return 1; }
  echo "worker on $ADDR: $(grep '^serving' "$OUT/worker.log")"
}
trap '[ -n "$WORKER_PID" ] && kill "$WORKER_PID" 2>/dev/null; wait' EXIT

build() {
  local sdist=${SDIST:-}
  [ -n "$sdist" ] || sdist=$(ls ~/.cache/foresight/sdist/llama_cpp_python-0.3.36.tar.gz "$G"/llama_cpp_python-0.3.36.tar.gz 2>/dev/null | head -n 1)
  python3 scripts/llama_build.py rpc-server --python python3 --target "$SITE" ${sdist:+--sdist "$sdist"} \
    ${FIND_LINKS:+--find-links "$FIND_LINKS"} > "$OUT/build-rpc.txt" 2>&1
  local rc=$?
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('rpc-server:', r.get('rpc_server') or r.get('rpc_server_error'))" \
    "$SITE/foresight-llama-build.json" | tee -a "$OUT/build-rpc.txt"
  tail -n 3 "$OUT/build-rpc.txt"; return $rc
}

devices() {
  worker || return 1
  python3 -m app devices --json --rpc "$ADDR" --target "$QWEN" > "$OUT/devices-rpc.json" 2> "$OUT/devices-rpc.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=[p for p in d['probes'] if p['path']=='remote'][0]
print('remote:', [(x['name'], round(x['free_bytes']/2**30, 1), x['latency_ms']) for x in r['devices']], r['error'])
print('placement:', d['placement']['reason'])" "$OUT/devices-rpc.json"
}

plain() {
  worker || return 1
  for name in gemma qwen; do
    local target=$GEMMA; [ $name = qwen ] && target=$QWEN
    python3 -m app bench --target "$target" --no-draft --rpc "$ADDR" "${THROUGH[@]}" --tokens "$TOKENS" \
      --repeat "$REPEAT" --json > "$OUT/bench-rpc-$name.jsonl" 2> "$OUT/bench-rpc-$name.err"
    python3 -m app bench --target "$target" --no-draft --rpc "$ADDR" "${THROUGH[@]}" --tokens "$TOKENS" \
      --repeat 1 --only chat-hashmap,edit-rename > "$OUT/bench-rpc-$name.txt" 2>&1
    echo "== $name: direct vs through the worker"
    python3 -c "import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
for r in rows[:-1]: print(f\"{r['name']:<24} {r['local_tok_s']:7.1f} {r['split_tok_s']:7.1f} t/s {r['ratio']:5.2f}x +{r['added_ms_per_token']:.3f} ms/token\", 'same' if r['match'] else f\"parts at {r.get('first_difference')} (near-tie {r.get('near_tie')})\")
print(rows[-1]['summary']); print('split:', rows[-1]['split'])" "$OUT/bench-rpc-$name.jsonl"
  done
}

ngram() {
  worker || return 1
  # the bench's own engine, set up as every engine process sets it up: the worker joins, then the placement
  python3 - "$QWEN" "$ADDR" "$TOKENS" "$REPEAT" > "$OUT/bench-rpc-ngram.txt" 2>&1 <<'EOF'
import llama_cpp  # noqa: F401  # before NumPy (a CUDA build segfaults otherwise)
import sys
from pathlib import Path

from app.cli.bench import load_prompts, run_bench
from app.config import load_settings
from app.devices import placement
from app.engine.engine import Engine
from app.resources import shipped

target, workers, tokens, repeat = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
engine_settings = {"rpc": workers, "device": "gpu", "tensor_split": [1.0, 0.0], "backend": "llama"}
settings = load_settings(overrides={"engine": engine_settings, "draft": {"mode": "ngram"}})
settled, placed = placement.settle(settings, target)
with Engine(target, None, settled) as engine:
    engine.placement = placement.describe(placed)
    print("target:", engine.props()["target"]["device_reason"])
    run_bench(engine, load_prompts(shipped("bench/prompts.json")), tokens, False, repeat)
EOF
  tail -n 24 "$OUT/bench-rpc-ngram.txt"
}

tests() {
  python3 -c "import importlib.util, sys
if importlib.util.find_spec('llama_cpp'): import llama_cpp
import pytest
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', 'tests/devices/test_rpc.py', 'tests/server/test_rpc.py']))" \
    > "$OUT/pytest-rpc.txt" 2>&1
  tail -n 4 "$OUT/pytest-rpc.txt"
}

case "${1:-all}" in
  all) build && devices; plain; ngram; tests ;;
  build|devices|plain|ngram|tests) "$1" ;;
  *) echo "usage: $0 [all|build|devices|plain|ngram|tests]"; exit 2 ;;
esac
