#!/usr/bin/env bash
# Runs every test: installs what is missing (tools/setup.sh), builds
# everything with Bazel, runs the Catch2 suites (`bazel test //...`) and the
# pytest suites against the real kregd binary and real JAX (tests/gpu skips,
# with the reason, where no CUDA GPU is visible), the Catch2 suites again
# under ASan + UBSan + LSan (--config=asan), the Python suites that
# drive kregd hardest against an ASan kregd (tools/asan_pytest.sh), the
# Catch2 suites under TSan (--config=tsan, tools/tsan_test.sh, with abseil
# built with TSan by tools/tsan_absl.sh: a few minutes the first time, then
# cached), and each libFuzzer
# target for a bounded time (tools/fuzz.sh; KREG_FUZZ_SECONDS, default 10),
# then prints `tests: N passed, N failed` (test cases, across all of them;
# one per fuzz target; a stage that exited non-zero counts as one more
# failure) as its last line. Each stage prints its wall time and status as
# `stage NAME: SECONDS s, exit CODE` when it ends.
#
#   tools/test.sh [--quick]
#
# --quick: the plain build, the Catch2 suites and pytest only (no ASan, no
# fuzzing); README says how long each run takes.
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
[[ "${1:-}" == "--quick" ]] && quick=1

out=$(mktemp -d)
rc=0

# stage NAME COMMAND...: runs COMMAND, prints the stage's wall time and exit
# status; a failure sets rc and reaches the summary (--failed-stage).
failed_stages=()
stage() {
  local name=$1 start=$SECONDS code=0
  shift
  "$@" || code=$?
  echo "stage $name: $((SECONDS - start)) s, exit $code"
  if [[ $code != 0 ]]; then
    rc=1
    failed_stages+=(--failed-stage "$name:$code")
  fi
}

catch2() {
  bazel query 'tests(//...)' 2>/dev/null | sort > "$out/targets"
  bazel test //...
}

python_suites() {
  .venv/bin/python -m pytest -q -rs -p no:cacheprovider \
    --junitxml="$out/pytest.xml" tests/python tests/integration tests/gpu
}

stage setup bash tools/setup.sh
[[ $rc == 0 ]] || exit 1
stage build bazel build //...
stage catch2 catch2
export KREG_BIN_DIR="$PWD/bazel-bin"
export KREG_KERNELS_DIR="$PWD/bazel-bin/kernels/cpu"
export KREG_CLIENT_LIB="$PWD/bazel-bin/client/shim/libkreg_client.so"
stage pytest python_suites

summary=("$out/targets" "$out/pytest.xml")
if [[ $quick == 0 ]]; then
  # Sanitizers: the Catch2 suites under ASan + UBSan + LSan. Their outputs
  # and logs have their own directory; bazel-bin stays the plain build.
  stage catch2-asan bazel test --config=asan $(cat "$out/targets")
  asan_logs=$(bazel info --config=asan bazel-testlogs 2>/dev/null)
  # The Python suites against ASan kregd/kregd-exec/kregd-probe.
  stage pytest-asan bash tools/asan_pytest.sh "$out"
  # The Catch2 suites under ThreadSanitizer, with a TSan build of abseil
  # (tools/tsan_absl.sh, cached) under them and the kregd processes they
  # start; any TSan report fails (tests/fuzz/README.md, "TSan").
  stage catch2-tsan bash tools/tsan_test.sh "$out" "$out/targets"
  tsan_logs=$(bazel info --config=tsan bazel-testlogs 2>/dev/null)
  stage fuzz bash tools/fuzz.sh --junit "$out/fuzz.xml"
  summary+=("$out/fuzz.xml" "$out/asan_pytest.xml" "$out/asan_reports.xml"
            "$out/tsan_reports.xml"
            --also-catch2 "$asan_logs" "$out/targets"
            --also-catch2 "$tsan_logs" "$out/targets")
fi

python3 tools/summarize_tests.py "$(bazel info bazel-testlogs 2>/dev/null)" \
  "${summary[@]}" "${failed_stages[@]}" || rc=1
exit $rc
