#!/usr/bin/env bash
# Install what the tests need and run them: the README's test command, and what CI runs.
# Debian's libamdhip64-5 (ROCm 5.2) provides hiprtc for the gfx compile tests; Debian's llvm
# provides llvm-objdump, which tests/test_inspect_amd.py reads the code objects with; g++ builds
# the kernel templates for the CPU (int4jit/emulate.py, tests/test_kernels_cpu.py).
set -euo pipefail
cd "$(dirname "$0")/.."
NEED=""
[ -e /usr/lib/x86_64-linux-gnu/libamdhip64.so.5 ] || NEED="libamdhip64-5"
command -v llvm-objdump >/dev/null || NEED="$NEED llvm"
command -v g++ >/dev/null || NEED="$NEED g++"
if [ -n "$NEED" ] && command -v apt-get >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $NEED >/dev/null
fi
python3 -m pip install -q -e '.[test]'
# torch for the int4jit.torch tests: 2.13.0 is the CPU build this machine kind carries on disk
# (a plain `pip install torch` would fetch a multi-GB CUDA build).
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q "torch==2.13.0"
exec python3 -m pytest -q -ra "$@"
