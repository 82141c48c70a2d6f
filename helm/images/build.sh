#!/usr/bin/env bash
# Builds Tributary's images from helm/images/Dockerfile (build context: the repository root):
#   <registry>/tributary/controller:<tag>, <registry>/tributary/agent:<tag>,
#   <registry>/tributary/trainer:<tag>
# Usage: helm/images/build.sh [--registry REG] [--tag TAG] [--push] [--target controller|agent|trainer]...
# Needs docker (BuildKit) with network access to deb.debian.org. The chart's image.registry,
# image.*.repository and image.*.tag must name what this pushed.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
registry="" tag="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$root/helm/tributary/Chart.yaml")"
push=0 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry="${2%/}/"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --push) push=1; shift ;;
    --target) targets+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(controller agent trainer)
command -v docker >/dev/null || { echo "build.sh: docker is not installed" >&2; exit 1; }
for t in "${targets[@]}"; do
  case "$t" in controller|agent|trainer) ;; *) echo "build.sh: unknown target $t" >&2; exit 2 ;; esac
  image="${registry}tributary/$t:$tag"
  echo "building $image"
  DOCKER_BUILDKIT=1 docker build --target "$t" -t "$image" -f "$root/helm/images/Dockerfile" "$root"
  if [ "$push" = 1 ]; then docker push "$image"; fi
done
