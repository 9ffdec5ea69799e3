#!/usr/bin/env bash
# One GPU batch (../shared/GPU.md) for the GPU path out of the box, the backend choice and the drafter
# pairs at real-size costs. The models arrive as chunks appended under /root/gpu/models; llama-cpp-python
# is built there by scripts/llama_build.py into /root/gpu/site. Results land in $OUT as small files.
#   gpu-round.sh setup     wait for the llama.cpp build, check the models' SHA-256     -> setup.txt
#   gpu-round.sh serve     `serve` on the default model with no device flags: /props, one answer, and
#                          `devices --json` (where it went and why)                       -> serve-*.json
#   gpu-round.sh tests     kernel, native-backend and backend-choice tests on the GPU     -> pytest-*.txt
#   gpu-round.sh backends  bench --backends llama,native (device bandwidth, % of the bound) on the
#                          default model, gemma-3-270m and a random Qwen2.5-7B shape      -> backends.txt
#   gpu-round.sh choice    what `auto` chose on each of the three, from its timings      -> auto-choice.txt
#   gpu-round.sh pair      the real pair (1.5B + 0.5B): trace recorded at 128 tokens, replayed, and the
#                          plain/speculative bench adaptive and forced                    -> pair-*.txt
#   gpu-round.sh replay SHAPE   bench --trace replay on a random SHAPE (7b|14b|32b) target with a random
#                          0.5B-shape drafter: real-size costs, small-pair acceptance      -> replay-SHAPE.txt
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=/root/gpu; M=$G/models
export PYTHONPATH=$G/site:$PWD FORESIGHT_HOME=${FORESIGHT_HOME:-/root/foresight-home} PYTHONUNBUFFERED=1
QWEN=$M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
GEMMA=$M/gemma-3-270m-q4_k_m.gguf
DRAFTER=$M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
TOKENS=${TOKENS:-128}
TRACE=$G/trace-128.json

random_model() {  # SHAPE -> a random-weight qwen2 GGUF of that shape (the tokenizer of the default model)
  local f="$G/random/$1.gguf"
  mkdir -p "$G/random"
  if [ ! -f "$f" ]; then
    case "$1" in
      0.5b) python3 .gpu/random_gguf.py "$G/vocab.gguf" "$f" 896 24 14 2 4864 --tied ;;
      7b) python3 .gpu/random_gguf.py "$G/vocab.gguf" "$f" 3584 28 28 4 18944 ;;
      14b) python3 .gpu/random_gguf.py "$G/vocab.gguf" "$f" 5120 48 40 8 13824 ;;
      32b) python3 .gpu/random_gguf.py "$G/vocab.gguf" "$f" 5120 64 40 8 27648 ;;
    esac > /dev/null || return 1
  fi
  echo "$f"
}

setup() {
  for _ in $(seq 1 100); do [ -f "$G/llama-build.done" ] && break; sleep 5; done
  { cat "$G/llama-build.done" 2>/dev/null || echo "build still running"; tail -n 5 "$G/llama-build.log"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    for f in "$QWEN:cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046" \
             "$GEMMA:a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818" \
             "$DRAFTER:1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"; do
      [ -f "${f%%:*}" ] && echo "${f##*:}  ${f%%:*}" | sha256sum -c
    done
    python3 -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__, llama_cpp.__file__)"
  } > "$OUT/setup.txt" 2>&1
  cat "$OUT/setup.txt"
}

serve() {
  local log=$G/serve.log port=""
  python3 -m app serve --target "$QWEN" --port 0 > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do
    port=$(sed -n 's/^READY port=//p' "$log" | head -1); [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break; sleep 0.5
  done
  if [ -n "$port" ]; then
    curl -s "http://127.0.0.1:$port/props" > "$OUT/serve-props.json"
    curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
      -d '{"messages": [{"role": "user", "content": "Write hello world in Python"}], "max_tokens": 64,
           "temperature": 0}' > "$OUT/serve-answer.json"
  else
    tail -n 20 "$log" > "$OUT/serve-failed.txt"
  fi
  kill "$pid"; wait "$pid"
  python3 -m app devices --json --target "$QWEN" > "$OUT/serve-devices.json" 2> "$OUT/serve-devices.err"
  python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
props = json.load(open(f"{out}/serve-props.json"))
t = props["target"]
print("serve, no device flags:", t["device"], t.get("backend"), "n_ctx", t["n_ctx"], "|", t.get("backend_reason", "")[:160])
print("placement:", props.get("placement"))
answer = json.load(open(f"{out}/serve-answer.json"))
print("answer:", str(answer)[:300])
d = json.load(open(f"{out}/serve-devices.json"))
print("devices --json: build", d["build"], "| placement", d["placement"], "| fixes", d["fixes"])
EOF
}

pyt() {  # pytest with llama_cpp imported before NumPy (a CUDA build segfaults otherwise)
  python3 -c "import importlib.util, sys
if importlib.util.find_spec('llama_cpp'): import llama_cpp
import pytest
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', *sys.argv[1:]]))" "$@"
}

tests() {
  export FORESIGHT_TEST_GEMMA=$GEMMA FORESIGHT_TEST_QWEN=$QWEN
  pyt tests/engine/kernels/test_gemv.py tests/engine/kernels/test_norm.py tests/engine/kernels/test_rope.py \
    tests/engine/kernels/test_qkv.py tests/engine/kernels/test_attention.py tests/engine/kernels/test_activation.py \
    tests/engine/kernels/test_sample.py > "$OUT/pytest-kernels.txt" 2>&1
  tail -n 3 "$OUT/pytest-kernels.txt"
  pyt -m gpu tests/engine/test_native_backend.py tests/engine/test_backend_choice.py tests/engine/test_gpu.py \
    tests/cli/test_backend_bench.py > "$OUT/pytest-native.txt" 2>&1
  tail -n 3 "$OUT/pytest-native.txt"
}

backends() {
  : > "$OUT/backends.txt"
  for m in "$QWEN" "$GEMMA" "$(random_model 7b)"; do
    python3 -m app bench --backends llama,native --target "$m" --tokens "$TOKENS" 2>&1 | grep -v WARNING >> "$OUT/backends.txt"
  done
  grep -E "^(model|bound|llama|native) " "$OUT/backends.txt" | cut -c1-170
}

choice() {
  python3 - "$QWEN" "$GEMMA" "$(random_model 7b)" > "$OUT/auto-choice.txt" 2>&1 <<'EOF'
import llama_cpp  # noqa: F401  # before NumPy (CUDA build)
import sys
from pathlib import Path

from app.config import DraftSettings, EngineSettings, Settings
from app.engine.engine import Engine

for path in map(Path, sys.argv[1:]):
    for mode in ("none", "ngram"):
        settings = Settings(engine=EngineSettings(backend="auto", device="gpu", n_ctx=4096),
                            draft=DraftSettings(mode=mode, max_draft=8))
        with Engine(path, None, settings) as engine:
            t = engine.props()["target"]
        print(path.name, "drafting" if mode == "ngram" else "plain", "->", t["backend"], "|", t["backend_reason"])
EOF
  cat "$OUT/auto-choice.txt" | cut -c1-400
}

pair() {
  local b="python3 -m app bench --target $QWEN --draft $DRAFTER --device gpu --draft-device gpu --tokens $TOKENS"
  $b --trace record --trace-file "$TRACE" > "$OUT/pair-record.txt" 2>&1; tail -n 16 "$OUT/pair-record.txt"
  cp "$TRACE" "$OUT/trace-128.json" 2>/dev/null
  $b > "$OUT/pair-adaptive.txt" 2>&1; tail -n 18 "$OUT/pair-adaptive.txt"
  $b --no-adaptive --max-draft 8 > "$OUT/pair-forced.txt" 2>&1; tail -n 18 "$OUT/pair-forced.txt"
}

replay() {
  local target drafter trace=$TRACE
  [ -f "$trace" ] || trace=bench/traces/qwen2.5-coder-1.5b+0.5b.json
  target=$(random_model "$1") && drafter=$(random_model 0.5b) || { echo "no random model"; return 1; }
  python3 -m app bench --trace replay --trace-file "$trace" --target "$target" --draft "$drafter" \
    --device gpu --draft-device gpu --backend llama --draft-backend llama --tokens "$TOKENS" \
    > "$OUT/replay-$1.txt" 2>&1
  tail -n 24 "$OUT/replay-$1.txt" | cut -c1-200
}

case "${1:-}" in
  setup | serve | tests | backends | choice | pair) "$1" ;;
  replay) replay "${2:?7b, 14b or 32b}" ;;
  *) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 2 ;;
esac
