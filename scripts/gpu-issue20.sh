#!/usr/bin/env bash
# Issue 20 on the lent GPU machine (../shared/GPU.md), in one batch: the kernel tests, NVML's raw figures
# and the bandwidth taken from them, `auto`'s measured choice of backend, and bench --backends' bound.
# It expects what gpu-bench.sh expects: llama-cpp-python (CUDA) and the carried wheels importable from
# $SITE (default /root/gpu/site), gemma-3-270m and the default model assembled under /root/gpu (or
# /root/gpu/models), and .gpu carried (random_gguf.py and vocab.gguf make the random 7B shape).
# Results land in $OUT as small text and JSON files.
#   gpu-issue20.sh [all]   everything below, in this order (about 8 minutes once llama.cpp is built)
#   gpu-issue20.sh nvml    raw NVML values, the bound they give, a measured device copy  -> nvml.txt
#   gpu-issue20.sh kernels kernel tests against the NumPy reference (no llama.cpp needed)  -> pytest-kernels.txt
#   gpu-issue20.sh native  native backend, backend choice and bench --backends tests       -> pytest-native.txt
#   gpu-issue20.sh choice  auto on gemma, the default model, a random Qwen2.5-7B shape, plain and drafting:
#                          first load (timed) and second (cached)                     -> auto-choice.jsonl
#   gpu-issue20.sh backends bench --backends llama,native on the three, with the device's own bound
#                                                                                        -> backends.txt
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=/root/gpu
export PYTHONPATH=${SITE:-$G/site}:$PWD
export FORESIGHT_HOME=${FORESIGHT_HOME:-/root/foresight-home-issue20}

model() {  # the assembled file of that name, wherever the stash put it
  for f in "$G/models/$1" "$G/$1"; do [ -f "$f" ] && { echo "$f"; return 0; }; done
  echo "missing: $1" >&2; return 1
}

GEMMA=$(model gemma-3-270m-q4_k_m.gguf 2>/dev/null) && export FORESIGHT_TEST_GEMMA=$GEMMA
QWEN=$(model qwen2.5-coder-1.5b-instruct-q4_k_m.gguf 2>/dev/null) && export FORESIGHT_TEST_QWEN=$QWEN

random7b() {
  local r="$G/random/qwen7b.gguf" vocab="$G/vocab.gguf"
  [ -f "$vocab" ] || vocab=.gpu/vocab.gguf
  mkdir -p "$G/random"
  [ -f "$r" ] || python3 .gpu/random_gguf.py "$vocab" "$r" 3584 28 28 4 18944 > /dev/null || return 1
  echo "$r"
}

pyt() {  # pytest with llama_cpp imported before NumPy where it is installed (a CUDA build segfaults otherwise)
  python3 -c "import importlib.util, sys
if importlib.util.find_spec('llama_cpp'): import llama_cpp
import pytest
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-s', '-rs', *sys.argv[1:]]))" "$@"
}

nvml() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv > "$OUT/gpu.txt" 2>&1
  python3 - > "$OUT/nvml.txt" 2>&1 <<'EOF'
from app.devices.bandwidth import device_bandwidth, from_copy, from_nvml, nvml_peak_bytes_per_s

try:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    width = pynvml.nvmlDeviceGetMemoryBusWidth(h)
    clock = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
    print(f"raw NVML: {pynvml.nvmlDeviceGetName(h)}, nvmlDeviceGetMemoryBusWidth {width} bits, "
          f"nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM) {clock} MHz -> {nvml_peak_bytes_per_s(width, clock) / 1e12:.3f} TB/s")
    pynvml.nvmlShutdown()
except Exception as exc:
    print(f"raw NVML: {type(exc).__name__}: {exc}")
for name, found in (("nvml", from_nvml()), ("copy", from_copy()), ("chosen", device_bandwidth())):
    print(f"{name}: {found.gb_s and round(found.gb_s)} GB/s ({found.source})")
EOF
  cat "$OUT/gpu.txt" "$OUT/nvml.txt"
}

kernels() {
  pyt tests/engine/kernels/test_gemv.py tests/engine/kernels/test_norm.py tests/engine/kernels/test_rope.py \
    tests/engine/kernels/test_qkv.py tests/engine/kernels/test_attention.py tests/engine/kernels/test_activation.py \
    tests/engine/kernels/test_sample.py > "$OUT/pytest-kernels.txt" 2>&1
  tail -n 4 "$OUT/pytest-kernels.txt"
}

native() {
  pyt tests/engine/test_native_backend.py tests/engine/test_backend_choice.py tests/cli/test_backend_bench.py \
    > "$OUT/pytest-native.txt" 2>&1
  grep -E "^auto on|passed|failed|error" "$OUT/pytest-native.txt" | tail -n 8
}

choice() {
  rm -rf "$FORESIGHT_HOME"  # measured afresh: the first load of each times both backends
  python3 - "${GEMMA:?}" "${QWEN:?}" "$(random7b)" > "$OUT/auto-choice.jsonl" 2> "$OUT/auto-choice.err" <<'EOF'
import llama_cpp  # noqa: F401  # before NumPy (CUDA build)
import json
import sys
import time
from pathlib import Path

from app.config import DraftSettings, EngineSettings, Settings
from app.engine.engine import Engine

for path in map(Path, sys.argv[1:]):
    for mode in ("none", "ngram"):
        settings = Settings(
            engine=EngineSettings(backend="auto", device="gpu", n_ctx=4096),
            draft=DraftSettings(mode=mode, max_draft=8),
        )
        for load in ("first", "again"):
            t0 = time.perf_counter()
            with Engine(path, None, settings) as engine:
                target = engine.props()["target"]
            record = {"model": path.name, "drafting": mode, "load": load, "load_s": round(time.perf_counter() - t0, 2)}
            record |= {k: target[k] for k in ("backend", "backend_reason", "backend_choice")}
            print(json.dumps(record), flush=True)
EOF
  cp "$FORESIGHT_HOME/cache/backend-timings.json" "$OUT/" 2>/dev/null
  python3 -c "import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print(r['model'], r['drafting'], r['load'], r['load_s'], 's:', r['backend'], '|', r['backend_reason'][:200])" "$OUT/auto-choice.jsonl"
  tail -n 3 "$OUT/auto-choice.err"
}

backends() {
  : > "$OUT/backends.txt"
  for m in "${GEMMA:?}" "${QWEN:?}" "$(random7b)"; do
    python3 -m app bench --backends llama,native --target "$m" --tokens 128 2>&1 | grep -v WARNING >> "$OUT/backends.txt"
  done
  grep -E "^(model|bound|llama|native) " "$OUT/backends.txt" | cut -c1-160
}

case "${1:-all}" in
  all) nvml; kernels; native; choice; backends ;;
  nvml | kernels | native | choice | backends) "$1" ;;
  *) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 2 ;;
esac
