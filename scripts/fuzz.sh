#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, preset fuzz: build-fuzz/ with clang-16, ASan + UBSan)
# and runs each for a given time, then prints one line per target: runs, execs/s, coverage.
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

scripts/install_deps.sh
if [ ! -f build-fuzz/build.ninja ]; then
  cmake --preset fuzz >/dev/null
fi
nice -n 15 ninja -C build-fuzz -j"$(nproc)" "${targets[@]/%/_fuzz}"

mkdir -p build-fuzz/findings build-fuzz/logs
run_one() {
  local t="$1"
  mkdir -p "build-fuzz/corpus/$t"
  # -rss_limit_mb: a parser that allocates gigabytes on a small input is a finding too.
  nice -n 15 "build-fuzz/bin/${t}_fuzz" "build-fuzz/corpus/$t" "tests/fuzz/corpus/$t" \
    -max_total_time="$seconds" ${FUZZ_RUNS:+-runs="$FUZZ_RUNS"} ${FUZZ_SEED:+-seed="$FUZZ_SEED"} \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/findings/$t-" >"build-fuzz/logs/$t.log" 2>&1
}
pids=()
names=()
status=0
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  names+=("$t")
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || { echo "FINDING in ${names[0]}: build-fuzz/logs/${names[0]}.log"; status=1; }
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "FINDING in ${names[$i]}: build-fuzz/logs/${names[$i]}.log"; status=1; }
done

printf '\n| target | seconds | runs | execs/s | cov | ft | corpus |\n|---|---|---|---|---|---|---|\n'
for t in "${targets[@]}"; do
  log="build-fuzz/logs/$t.log"
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
