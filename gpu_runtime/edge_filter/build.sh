#!/usr/bin/env bash
# Compile keel's edge filter (keel_edge.c: freestanding C) to WebAssembly for Envoy's V8 runtime with zig's clang.
#   gpu_runtime/edge_filter/build.sh PYTHON   — PYTHON: an interpreter with the pinned ziglang (requirements-wasm.txt)
# scripts/setup runs it with .venv-wasm's; docker/runtime.Dockerfile with a throwaway one. The .wasm is written
# atomically (a half-written module is never loaded) and never committed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$here/build"
"$1" -m ziglang cc --target=wasm32-freestanding -nostdlib -O2 -Wl,--no-entry \
  -o "$here/build/keel_edge.wasm.tmp" "$here/keel_edge.c"
mv "$here/build/keel_edge.wasm.tmp" "$here/build/keel_edge.wasm"
