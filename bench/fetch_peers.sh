#!/usr/bin/env bash
# Prepare the benchmark-only peers for a GPU machine with no network: the bitsandbytes wheel
# into .whl/ (carried and installed like the others) and gemlite's package folder into .peers/.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.peers/' .git/info/exclude || echo '/.peers/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 -d .whl bitsandbytes
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" gemlite
mkdir -p .peers && tar -xzf "$tmp"/gemlite-*.tar.gz -C "$tmp" && rm -rf .peers/gemlite && cp -r "$tmp"/gemlite-*/gemlite .peers/
echo "carry .whl and .peers; run: python3 bench/suite.py"
