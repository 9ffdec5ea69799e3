#!/usr/bin/env bash
# Issue 23 on the lent GPU machine (../shared/GPU.md), in one batch of at most 9 minutes: the int8-activation
# GEMV (mmvq.cu, [engine] native_gemv = "fast") beside today's kernels (gemv.cu, "reference").
# It expects what gpu-issue20.sh expects: llama-cpp-python (CUDA) and the carried wheels importable from
# $SITE (default /root/gpu/site), gemma-3-270m and the default model (Qwen2.5-Coder-1.5B) assembled under
# /root/gpu (or /root/gpu/models), and .gpu carried (random_gguf.py and vocab.gguf make the random 7B and
# 32B shapes). Every step writes its own files under $OUT and its exit status and time to steps.txt; a step
# that fails or runs out of time stops only itself, and the whole batch keeps within $BUDGET seconds
# (default 530): steps that no longer fit are skipped and say so.
#   gpu-issue23.sh [all]    everything below, in this order (estimate: 7-8 minutes, llama.cpp already built)
#   gpu-issue23.sh kernels  the GPU kernel tests (-m gpu: the CPU ones ran before the batch), both GEMV sets
#                           against the NumPy reference and mmvq.cu against its own CPU run -> pytest-kernels.txt
#   gpu-issue23.sh bench7b  bench llama, native:reference, native:fast on a random Qwen2.5-7B shape: decode
#                           tok/s, GB/s and share of the bound, verify k = 1..16 (k=16 in decode steps),
#                           launches and graph replay per step                        -> bench-7b.txt/.jsonl
#   gpu-issue23.sh kbench   scripts/kernel-bench.py: every type and (out, in) of the issue, b = 1..16, both
#                           sets, the fast one also at 1, 2, 4 rows per lane group and 1, 2, 4 warps per
#                           block (what mmvq.py's table should pick)                  -> kernel-bench.txt/.json
#   gpu-issue23.sh native   native backend tests: logits against the reference, verify == steps and greedy
#                           vs llama.cpp with both GEMV sets; speculative decoding exact (through the Engine,
#                           which builds the backend with the default set)           -> pytest-native.txt
#   gpu-issue23.sh bench15b bench llama, native:fast on Qwen2.5-Coder-1.5B            -> bench-1.5b.txt/.jsonl
#   gpu-issue23.sh bench32b bench llama, native:fast on a random Qwen2.5-32B shape    -> bench-32b.txt/.jsonl
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=/root/gpu
export PYTHONPATH=${SITE:-$G/site}:$PWD
export FORESIGHT_HOME=${FORESIGHT_HOME:-/root/foresight-home-issue23}  # the kernels compile once for all steps
BUDGET=${BUDGET:-530}

model() {  # the assembled file of that name, wherever the stash put it
  for f in "$G/models/$1" "$G/$1"; do [ -f "$f" ] && { echo "$f"; return 0; }; done
  echo "missing: $1" >&2; return 1
}
GEMMA=$(model gemma-3-270m-q4_k_m.gguf 2>/dev/null) && export FORESIGHT_TEST_GEMMA=$GEMMA
QWEN=$(model qwen2.5-coder-1.5b-instruct-q4_k_m.gguf 2>/dev/null) && export FORESIGHT_TEST_QWEN=$QWEN

random_model() {  # random_model NAME N_EMBD N_LAYER N_HEAD N_KV N_FF: a random-weight qwen2 file of that shape
  local r="$G/random/$1.gguf" vocab="$G/vocab.gguf"
  [ -f "$vocab" ] || vocab=.gpu/vocab.gguf
  mkdir -p "$G/random"
  [ -f "$r" ] || python3 .gpu/random_gguf.py "$vocab" "$r" "${@:2}" > /dev/null || return 1
  echo "$r"
}

pyt() {  # pytest with llama_cpp imported before NumPy where it is installed (a CUDA build segfaults otherwise)
  python3 -c "import importlib.util, sys
if importlib.util.find_spec('llama_cpp'): import llama_cpp
import pytest
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-s', '-rs', *sys.argv[1:]]))" "$@"
}

bench() {  # bench FILE OUTNAME TOKENS WIDTHS REPEATS BACKEND...: one run, JSON lines, then a table of them
  local name=$2
  python3 - "$@" > "$OUT/bench-$name.jsonl" 2> "$OUT/bench-$name.err" <<'EOF'
import importlib.util
import sys

if importlib.util.find_spec("llama_cpp"):
    import llama_cpp  # noqa: F401  # before NumPy (CUDA build)
from pathlib import Path

from app.cli.backend_bench import bytes_per_token, compare

path, _, tokens, widths, repeats, *backends = sys.argv[1:]
print('{"model": "%s", "bytes_per_token": %d}' % (Path(path).name, bytes_per_token(Path(path))), flush=True)
compare(Path(path), backends, int(tokens), True, widths=tuple(int(k) for k in widths.split(",")),
        repeats=int(repeats))
EOF
  python3 - "$OUT/bench-$name.jsonl" > "$OUT/bench-$name.txt" <<'EOF'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
print(rows[0]["model"], f"{rows[0]['bytes_per_token'] / 1e6:.0f} MB per token")
for r in rows[1:]:
    share = r.get("bound_share")
    vs = next((f"{v}x {k[len('speedup_vs_'):]}" for k, v in r.items() if k.startswith("speedup_vs_")), "")
    print(f"{r['backend']:17} {r['tok_s']} tok/s, {r['step_ms']} ms/token, {r.get('gb_s')} GB/s"
          f" ({share and round(100 * share, 1)}% of {r.get('bandwidth_gb_s')} GB/s, {r.get('bandwidth_source')})"
          f" {vs}; k={max(r['verify_ms'], key=int)}: {r['verify_steps']} steps;"
          f" parts at {next((v for k, v in r.items() if k.startswith('first_difference')), '-')}")
    print("    verify ms: " + " ".join(f"{k}:{v}" for k, v in r["verify_ms"].items()))
    for p in r.get("profile", []):
        top = ", ".join(f"{k} {v['launches']}x {v['ms']:.3f}" for k, v in list(p["kernels"].items())[:5])
        print(f"    width {p['width']}: {p['launches']} launches, kernels {p['kernel_ms']} ms,"
              f" graph replay {p['graph_replay_ms']} ms; {top}")
EOF
  cat "$OUT/bench-$name.txt"; tail -n 3 "$OUT/bench-$name.err"
}

kernels() {
  pyt -m gpu tests/engine/kernels/test_mmvq.py tests/engine/kernels/test_gemv.py tests/engine/kernels/test_norm.py \
    tests/engine/kernels/test_rope.py tests/engine/kernels/test_qkv.py tests/engine/kernels/test_attention.py \
    tests/engine/kernels/test_activation.py tests/engine/kernels/test_sample.py \
    > "$OUT/pytest-kernels.txt" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest-kernels.txt" | head -n 20; tail -n 2 "$OUT/pytest-kernels.txt"
}

native() {
  pyt -m gpu tests/engine/test_native_backend.py > "$OUT/pytest-native.txt" 2>&1
  grep -E "^native|^(FAILED|ERROR)|passed|failed" "$OUT/pytest-native.txt" | tail -n 12
}

kbench() {
  python3 scripts/kernel-bench.py --models issue23 --types q4_k,q5_k,q6_k,q8_0 --kernels reference,fast \
    --batches 1,2,4,8,16 --rows-per-group 1,2,4 --warps 1,2,4 --repeats 9 --json \
    > "$OUT/kernel-bench.json" 2> "$OUT/kernel-bench.err"
  python3 - "$OUT/kernel-bench.json" > "$OUT/kernel-bench.txt" <<'EOF'
import json
import sys

doc = json.load(open(sys.argv[1]))
print(f"{doc['device']}; bound {doc['peak_gb_s']} GB/s ({doc['peak_source']}); * the table's choice")
for r in doc["results"]:
    fast = r["kernels"] == "fast"
    variant = f"r{r['rows_per_group']} w{r['warps']}" if fast else ""
    print(f"{r['matrix']:12} {r['out']:>6}x{r['in']:<6} {r['type']:5} {r['kernels']:9} {variant:5}"
          f"{'*' if r['table'] else ' '} b={r['b']:<3} {r['us']:9.2f} us {r['gb_s']:8.1f} GB/s"
          f" {100 * r['of_peak']:5.1f}%")
EOF
  grep -E "\* b=1 " "$OUT/kernel-bench.txt" | head -n 40; tail -n 3 "$OUT/kernel-bench.err"
}

bench7b() {
  local f; f=$(random_model qwen7b 3584 28 28 4 18944) || return 1
  bench "$f" 7b 128 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 10 llama native:reference native:fast
}

bench15b() { bench "${QWEN:?}" 1.5b 128 1,2,4,8,16 8 llama native:fast; }

bench32b() {
  local f; f=$(random_model qwen32b 5120 64 40 8 27648) || return 1
  bench "$f" 32b 64 1,4,8,16 5 llama native:fast
}

step() {  # step NAME SECONDS: that mode in a child, within SECONDS and what is left of the budget
  local name=$1 limit=$2 left=$((BUDGET - ($(date +%s) - START)))
  (( limit > left )) && limit=$left
  if (( limit < 20 )); then echo "$name: skipped, $left s of the $BUDGET s budget left" | tee -a "$OUT/steps.txt"; return; fi
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" bash "$0" "$name"; local rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - t0 )) s (limit $limit s)" | tee -a "$OUT/steps.txt"
}

case "${1:-all}" in
  all)
    START=$(date +%s); : > "$OUT/steps.txt"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv > "$OUT/gpu.txt" 2>&1
    step kernels 150; step bench7b 120; step kbench 75; step native 120; step bench15b 60; step bench32b 150
    cat "$OUT/steps.txt" ;;
  kernels | bench7b | kbench | native | bench15b | bench32b) "$1" ;;
  *) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 2 ;;
esac
