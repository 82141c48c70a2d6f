#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, preset fuzz: build-fuzz/ with clang-16, ASan + UBSan;
# FUZZ_BUILD=asan: build-asan/, below; "build-fuzz/" here stands for the build used) and runs each
# for a given time, then prints one line per target: runs, execs/s, coverage.
#   scripts/fuzz.sh [seconds per target, default 60] [target ...]   (default: every target)
# FUZZ_JOBS=N runs N targets at once (default 1). FUZZ_RUNS=N stops each target after N inputs and
# FUZZ_SEED=S fixes libFuzzer's seed: with both (and no build-fuzz/corpus left from earlier runs)
# a run is the same every time, as CI needs. New inputs go to build-fuzz/corpus/<target>
# (the committed seeds in tests/fuzz/corpus/<target> are only read); a finding is written to
# build-fuzz/findings/<target>-crash-... and fails the script: reproduce it with
# build-fuzz/bin/<target>_fuzz <file>, fix it, add a regression test and commit the file into
# tests/fuzz/corpus/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
all=(wire_header bundle plan_view nccl_xml nvidia_smi topology_json topology_yaml)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
jobs="${FUZZ_JOBS:-1}"
# FUZZ_BUILD=asan uses the targets of build-asan/ (preset asan: coverage on the decoders only,
# built beside the ASan tests; what CI runs) instead of build-fuzz/ (preset fuzz: coverage on
# every source, for long runs).
preset="${FUZZ_BUILD:-fuzz}"
case "$preset" in
  fuzz | asan) ;;
  *)
    echo "FUZZ_BUILD must be fuzz or asan, not '$preset'" >&2
    exit 2
    ;;
esac
dir="build-$preset"

scripts/install_deps.sh
if [ ! -f "$dir/build.ninja" ]; then
  cmake --preset "$preset" >/dev/null
fi
nice -n 15 ninja -C "$dir" -j"$(nproc)" "${targets[@]/%/_fuzz}"

mkdir -p "$dir/findings" "$dir/logs"
run_one() {
  local t="$1"
  mkdir -p "$dir/corpus/$t"
  # -rss_limit_mb: a parser that allocates gigabytes on a small input is a finding too.
  nice -n 15 "$dir/bin/${t}_fuzz" "$dir/corpus/$t" "tests/fuzz/corpus/$t" \
    -max_total_time="$seconds" ${FUZZ_RUNS:+-runs="$FUZZ_RUNS"} ${FUZZ_SEED:+-seed="$FUZZ_SEED"} \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/findings/$t-" >"$dir/logs/$t.log" 2>&1
}
pids=()
names=()
status=0
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  names+=("$t")
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || { echo "FINDING in ${names[0]}: $dir/logs/${names[0]}.log"; status=1; }
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "FINDING in ${names[$i]}: $dir/logs/${names[$i]}.log"; status=1; }
done

printf '\n| target | seconds | runs | execs/s | cov | ft | corpus |\n|---|---|---|---|---|---|---|\n'
for t in "${targets[@]}"; do
  log="$dir/logs/$t.log"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$seconds" "${runs:-?}" "${eps:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}"
done
exit $status
