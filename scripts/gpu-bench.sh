#!/usr/bin/env bash
# On the lent GPU machine (see ../shared/GPU.md), after the models and the llama-cpp-python build were
# stashed with .gpu/remote.sh: GPU tests, both benchmarks and the naive n-gram baseline, results in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bash .gpu/remote.sh wait-llama && bash .gpu/remote.sh gemma && bash .gpu/remote.sh qwen || exit 1
export PYTHONPATH=/root/gpu/site:$PWD FORESIGHT_HOME=/root/foresight-home
Q=/root/gpu/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
G=/root/gpu/gemma-3-270m-q4_k_m.gguf
TOKENS=${TOKENS:-256}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
FORESIGHT_TEST_GEMMA=$G FORESIGHT_TEST_QWEN=$Q python3 -m pytest -o addopts="" -p no:cacheprovider -m gpu -q -s \
  tests/test_gpu.py > "$OUT/pytest-gpu.txt" 2>&1
python3 -m app bench --target "$Q" --ngram --device gpu --tokens "$TOKENS" > "$OUT/bench-ngram.txt" 2>&1
python3 -m app bench --target "$Q" --draft "$G" --device gpu --draft-device gpu --tokens "$TOKENS" \
  > "$OUT/bench-cross.txt" 2>&1
python3 .gpu/naive_ngram.py "$Q" bench/prompts.json --tokens "$TOKENS" --k 4,8,16 > "$OUT/naive-ngram.txt" 2>&1
tail -n 25 "$OUT"/bench-*.txt "$OUT/pytest-gpu.txt"
