#!/usr/bin/env bash
# Install int4jit and run its main job: `int4jit` on the default workload.
# With a GPU it selects/tunes, runs and checks a few LLM shapes; without one it compiles
# for sm_90, gfx90a and gfx1030 (Debian's libamdhip64-5 provides hiprtc), runs a few blocks of
# each kernel on the CPU (built by g++) and checks the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
NEED=""
[ -e /usr/lib/x86_64-linux-gnu/libamdhip64.so.5 ] || [ -d /opt/rocm/lib ] || NEED="libamdhip64-5"
command -v g++ >/dev/null || NEED="$NEED g++"
if [ -n "$NEED" ] && command -v apt-get >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $NEED >/dev/null
fi
python3 -m pip install -q '.[cuda]'
exec int4jit "$@"
