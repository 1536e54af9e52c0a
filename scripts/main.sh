#!/usr/bin/env bash
# Install int4jit and run its main job: `int4jit` on the default workload.
# With a GPU it selects/tunes, runs and checks a few LLM shapes; without one it compiles
# for sm_90, gfx90a and gfx1030 (Debian's libamdhip64-5 provides hiprtc) and checks the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! [ -e /usr/lib/x86_64-linux-gnu/libamdhip64.so.5 ] && ! [ -d /opt/rocm/lib ] && command -v apt-get >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libamdhip64-5 >/dev/null
fi
python3 -m pip install -q '.[cuda]'
exec int4jit "$@"
