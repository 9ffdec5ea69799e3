#!/usr/bin/env bash
# On the lent GPU machine (see ../shared/GPU.md), after the models and the llama-cpp-python build were
# stashed with .gpu/remote.sh. Results land in $OUT.
#   gpu-bench.sh prepare   collect the build, assemble both models, run the GPU tests
#   gpu-bench.sh shapes    verify-pass timings by width: steady, and after a change of width
#   gpu-bench.sh ngram     n-gram prompt lookup
#   gpu-bench.sh fixed     n-gram at a fixed draft length 16 (as the naive loop), argmax on device and host
#   gpu-bench.sh cross     gemma-3-270m drafting across vocabularies, and the naive n-gram baseline
#   gpu-bench.sh trace     n-gram with every pass recorded (--json), at a fixed length 16 for comparison,
#                          the naive loop at k=16, and greedy answers for scripts/policy-sim.py
#   gpu-bench.sh fa        flash attention off and auto: pass timings, n-gram runs, the naive loop beside
#   gpu-bench.sh final     n-gram over every prompt (table, and passes for the edits) beside the naive loop
#   gpu-bench.sh native    kernel and native-backend tests; native vs llama.cpp (decode, verify, GB/s, kernel
#                          profile) on both models and on random-weight Qwen2.5-7B and 0.5B shapes
#   gpu-bench.sh placement devices --json; one answer and tok/s per placement: all on the GPU, drafter
#                          on the CPU, half the target's layers on the CPU (and two GPUs when there are)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/root/gpu/site:$PWD FORESIGHT_HOME=/root/foresight-home
Q=/root/gpu/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
G=/root/gpu/gemma-3-270m-q4_k_m.gguf
TOKENS=${TOKENS:-256}
REPEAT=${REPEAT:-}  # e.g. 3: each side of every prompt runs three times, alternating; the median run is reported
bench() { python3 -m app bench --target "$Q" --device gpu --backend llama --tokens "$TOKENS" ${REPEAT:+--repeat "$REPEAT"} "$@"; }
case "${1:-}" in
  prepare)
    bash .gpu/remote.sh wait-llama && bash .gpu/remote.sh gemma && bash .gpu/remote.sh qwen || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
    # pytest plugins there import NumPy early; llama_cpp must come first (CUDA build), so start from it.
    FORESIGHT_TEST_GEMMA=$G FORESIGHT_TEST_QWEN=$Q python3 -c "import llama_cpp, sys, pytest; \
      sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-m', 'gpu', '-q', '-s', 'tests/engine/test_gpu.py']))" \
      > "$OUT/pytest-gpu.txt" 2>&1
    tail -n 5 "$OUT/pytest-gpu.txt" ;;
  shapes)
    bench --no-draft --shapes > "$OUT/shapes.txt" 2>&1
    cat "$OUT/shapes.txt" | cut -c1-140 ;;
  ngram)
    bench --ngram > "$OUT/bench-ngram.txt" 2>&1
    tail -n 22 "$OUT"/bench-ngram.txt ;;
  fixed)
    only=edit-rename,edit-fix-offbyone,edit-fstrings,verbatim-copy
    bench --ngram --no-adaptive --only "$only" > "$OUT/bench-ngram-fixed16.txt" 2>&1
    bench --ngram --no-adaptive --no-device-argmax --only "$only" > "$OUT/bench-ngram-fixed16-host.txt" 2>&1
    bench --ngram --no-device-argmax > "$OUT/bench-ngram-host.txt" 2>&1
    tail -n 22 "$OUT"/bench-ngram-*.txt ;;
  cross)
    bench --draft "$G" --draft-device gpu > "$OUT/bench-cross.txt" 2>&1
    python3 .gpu/naive_ngram.py "$Q" bench/prompts.json --tokens "$TOKENS" --k 4,8,16 > "$OUT/naive-ngram.txt" 2>&1
    tail -n 22 "$OUT/bench-cross.txt"; cat "$OUT/naive-ngram.txt" | cut -c1-150 ;;
  trace)
    bench --ngram --json > "$OUT/bench-ngram.jsonl" 2> "$OUT/bench-ngram.err"
    bench --ngram --no-adaptive --only edit-rename,edit-typehints,edit-fstrings,edit-fix-offbyone,verbatim-copy \
      > "$OUT/bench-ngram-fixed16.txt" 2>&1
    python3 .gpu/naive_ngram.py "$Q" bench/prompts.json --tokens "$TOKENS" --k 16 > "$OUT/naive-ngram.txt" 2>&1
    python3 scripts/policy-sim.py record --target "$Q" --tokens 384 --out "$OUT/answers-gpu.json" > "$OUT/record.txt" 2>&1
    python3 -c "import json,sys; [print(r['prompt'], r['ratio'], r['draft_lengths'], ' '.join(r['passes'])) \
for r in map(json.loads, open(sys.argv[1])) if 'prompt' in r and r['kind'] == 'code-edit']" "$OUT/bench-ngram.jsonl" | cut -c1-600
    grep -E "^edit|^verb" "$OUT/bench-ngram-fixed16.txt"; grep '"k": 16' "$OUT/naive-ngram.txt" | cut -c1-110 ;;
  fa)
    edits=edit-docstrings,edit-rename,edit-typehints,edit-fstrings,edit-fix-offbyone,verbatim-copy
    bench --no-draft --shapes --flash-attn off > "$OUT/shapes-fa-off.txt" 2>&1
    for fa in off auto; do bench --ngram --json --flash-attn $fa > "$OUT/bench-ngram-fa-$fa.jsonl" 2> "$OUT/bench-fa-$fa.err"; done
    bench --ngram --no-adaptive --flash-attn off --only "$edits" > "$OUT/bench-fixed16-fa-off.txt" 2>&1
    python3 .gpu/naive_ngram.py "$Q" bench/prompts.json --tokens "$TOKENS" --k 16 > "$OUT/naive-ngram.txt" 2>&1
    for fa in off auto; do echo "== flash attention $fa"; python3 -c "import json,sys; [print(f\"{r['prompt']:<24} {r['ratio']:5.2f}x {r['spec_tok_s']:7.0f} t/s plain {r['plain_tok_s']:5.0f}\", \
r['draft_lengths']) for r in map(json.loads, open(sys.argv[1])) if 'prompt' in r]" "$OUT/bench-ngram-fa-$fa.jsonl"; done
    grep -E "^edit|^verb" "$OUT/bench-fixed16-fa-off.txt" | cut -c1-80; grep -E "^device/steady" "$OUT/shapes-fa-off.txt"
    grep '"k": 16' "$OUT/naive-ngram.txt" | cut -c1-100 ;;
  final)
    bench --ngram > "$OUT/bench-ngram.txt" 2>&1
    python3 .gpu/naive_ngram.py "$Q" bench/prompts.json --tokens "$TOKENS" --k 4,8,16 > "$OUT/naive-ngram.txt" 2>&1
    tail -n 22 "$OUT/bench-ngram.txt"; grep -E '"k": 16' "$OUT/naive-ngram.txt" | cut -c1-100 ;;
  native)
    export FORESIGHT_TEST_GEMMA=$G FORESIGHT_TEST_QWEN=$Q
    python3 -c "import llama_cpp, sys, pytest; sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', \
      '-q', '-s', '-rs', 'tests/engine/kernels/test_gemv.py', 'tests/engine/kernels/test_norm.py', \
      'tests/engine/kernels/test_rope.py', 'tests/engine/kernels/test_qkv.py', 'tests/engine/kernels/test_attention.py', \
      'tests/engine/kernels/test_activation.py', 'tests/engine/kernels/test_sample.py', 'tests/engine/test_native_backend.py']))" \
      > "$OUT/pytest-native.txt" 2>&1
    tail -n 30 "$OUT/pytest-native.txt"
    R=/root/gpu/random; mkdir -p "$R"; [ -f /root/gpu/vocab.gguf ] || cp .gpu/vocab.gguf /root/gpu/
    [ -f "$R/qwen7b.gguf" ] || python3 .gpu/random_gguf.py /root/gpu/vocab.gguf "$R/qwen7b.gguf" 3584 28 28 4 18944 > /dev/null
    [ -f "$R/qwen05b.gguf" ] || python3 .gpu/random_gguf.py /root/gpu/vocab.gguf "$R/qwen05b.gguf" 896 24 14 2 4864 --tied > /dev/null
    for m in "$G" "$Q" "$R/qwen7b.gguf" "$R/qwen05b.gguf"; do
      python3 -m app bench --backends llama,native --target "$m" --tokens 128 2>&1 | grep -v WARNING | tee -a "$OUT/backends.txt"
    done ;;
  placement)
    P="$OUT/placement"; mkdir -p "$P"
    python3 -m app devices --json --target "$Q" > "$P/devices.json" 2> "$P/devices.err"
    python3 -m app devices --target "$Q" > "$P/devices.txt" 2>&1
    ask() {  # placement name, then engine flags: one factual answer (greedy), where it ran, its speed
      local name=$1; shift
      python3 -m app generate --target "$Q" --temperature 0 --max-tokens 48 --json "$@" \
        "What is the capital of France? Answer in one sentence." > "$P/answer-$name.json" 2> "$P/answer-$name.err"
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); p=d['placement']; \
print(sys.argv[2], repr(d['text']), p['target']['device_reason'], '| draft:', p['draft'])" "$P/answer-$name.json" "$name"; }
    n=$(nvidia-smi -L | wc -l)
    ask gpu-ngram --device gpu --ngram; ask gpu-gemma --device gpu --draft "$G" --draft-device gpu
    ask draft-cpu --device gpu --draft "$G" --draft-device cpu; ask partial --device gpu --gpu-layers 14 --ngram
    [ "$n" -ge 2 ] && { ask two-gpus --device gpu:0 --draft "$G" --draft-device gpu:1
                        ask split --device gpu --tensor-split 1,1 --ngram; }
    only=edit-rename,chat-tcp-udp,write-merge-intervals
    bench --ngram --only "$only" > "$P/bench-gpu-ngram.txt" 2>&1
    bench --ngram --gpu-layers 14 --only "$only" > "$P/bench-partial-ngram.txt" 2>&1
    bench --draft "$G" --draft-device gpu --only "$only" > "$P/bench-gpu-gemma.txt" 2>&1
    bench --draft "$G" --draft-device cpu --only "$only" > "$P/bench-draftcpu-gemma.txt" 2>&1
    [ "$n" -ge 2 ] && { bench --device gpu:0 --draft "$G" --draft-device gpu:1 --only "$only" > "$P/bench-two-gpus.txt" 2>&1
                        bench --tensor-split 1,1 --ngram --only "$only" > "$P/bench-split.txt" 2>&1; }
    for f in "$P"/bench-*.txt; do echo "== $(basename "$f")"; grep -E "^(edit|chat|write)-" "$f" | cut -c1-120; done
    tar czf "$OUT/placement.tgz" -C "$OUT" placement && rm -rf "$P" ;;
  *) echo "usage: gpu-bench.sh prepare|shapes|ngram|fixed|cross|trace|fa|final|placement"; exit 2 ;;
esac
