#!/usr/bin/env bash
# Installs the Debian packages lingtrain needs, skipping apt entirely when they are all present.
# Called by `make` before configuring; safe to run any number of times.
# With --test, also what only the tests need: headless Chromium (the report page test) and a font. With
# --fuzz, clang (libFuzzer and the sanitizers' runtimes come with it) for the fuzz build `make test` starts
# with.
set -euo pipefail

# MPICH rather than Open MPI: its mpiexec runs as root and oversubscribes cores with no extra flags.
packages=(g++ cmake ninja-build make libgtest-dev libgmock-dev libbenchmark-dev libhwy-dev nlohmann-json3-dev
          libpcre2-dev mpich libmpich-dev)
if [ "${1:-}" = "--test" ]; then
  packages+=(chromium fonts-dejavu-core)
elif [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang)
elif [ $# -gt 0 ]; then
  echo "setup: unknown argument '$1' (--test or --fuzz)" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
