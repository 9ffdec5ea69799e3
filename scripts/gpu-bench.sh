#!/usr/bin/env bash
# On the lent GPU machine (see ../shared/GPU.md), after the models and the llama-cpp-python build were
# stashed with .gpu/remote.sh. Results land in $OUT.
#   gpu-bench.sh prepare   collect the build, assemble both models, run the GPU tests
#   gpu-bench.sh shapes    verify-pass timings by width: steady, and after a change of width
#   gpu-bench.sh ngram     n-gram prompt lookup
#   gpu-bench.sh fixed     n-gram at a fixed draft length 16 (as the naive loop), argmax on device and host
#   gpu-bench.sh cross     gemma-3-270m drafting across vocabularies, and the naive n-gram baseline
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/root/gpu/site:$PWD FORESIGHT_HOME=/root/foresight-home
Q=/root/gpu/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
G=/root/gpu/gemma-3-270m-q4_k_m.gguf
TOKENS=${TOKENS:-256}
bench() { python3 -m app bench --target "$Q" --device gpu --tokens "$TOKENS" "$@"; }
case "${1:-}" in
  prepare)
    bash .gpu/remote.sh wait-llama && bash .gpu/remote.sh gemma && bash .gpu/remote.sh qwen || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
    # pytest plugins there import NumPy early; llama_cpp must come first (CUDA build), so start from it.
    FORESIGHT_TEST_GEMMA=$G FORESIGHT_TEST_QWEN=$Q python3 -c "import llama_cpp, sys, pytest; \
      sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-m', 'gpu', '-q', '-s', 'tests/test_gpu.py']))" \
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
  *) echo "usage: gpu-bench.sh prepare|shapes|ngram|fixed|cross"; exit 2 ;;
esac
