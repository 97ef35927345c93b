#!/usr/bin/env bash
# Runs every test: installs what is missing (tools/setup.sh), builds
# everything with Bazel, runs the Catch2 suites (`bazel test //...`) and the
# pytest suites against the real kregd binary and real JAX (tests/gpu skips,
# with the reason, where no CUDA GPU is visible), the Catch2 suites again
# under ASan + UBSan + LSan (--config=asan, issue 9), the Python suites that
# drive kregd hardest against an ASan kregd (tools/asan_pytest.sh), the
# Catch2 suites under TSan (--config=tsan, tools/tsan_test.sh, with abseil
# built with TSan by tools/tsan_absl.sh: a few minutes the first time, then
# cached), and each libFuzzer
# target for a bounded time (tools/fuzz.sh; KREG_FUZZ_SECONDS, default 25),
# then prints `tests: N passed, N failed` (test cases, across all of them;
# one per fuzz target) as its last line.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1

out=$(mktemp -d)
rc=0
bazel build //... || rc=1
bazel query 'tests(//...)' 2>/dev/null | sort > "$out/targets"
bazel test //... || rc=1

export KREG_BIN_DIR="$PWD/bazel-bin"
export KREG_KERNELS_DIR="$PWD/bazel-bin/kernels/cpu"
export KREG_CLIENT_LIB="$PWD/bazel-bin/client/shim/libkreg_client.so"
.venv/bin/python -m pytest -q -rs -p no:cacheprovider \
  --junitxml="$out/pytest.xml" tests/python tests/integration tests/gpu || rc=1

# Sanitizers: the Catch2 suites under ASan + UBSan + LSan. Their outputs and
# logs have their own directory; bazel-bin stays the plain build.
bazel test --config=asan $(cat "$out/targets") || rc=1
asan_logs=$(bazel info --config=asan bazel-testlogs 2>/dev/null)
# The Python suites against ASan kregd/kregd-exec/kregd-probe.
bash tools/asan_pytest.sh "$out" || rc=1
# The Catch2 suites under ThreadSanitizer, with a TSan build of abseil
# (tools/tsan_absl.sh, cached) under them and the kregd processes they start;
# any TSan report fails (tests/fuzz/README.md, "TSan").
bash tools/tsan_test.sh "$out" "$out/targets" || rc=1
tsan_logs=$(bazel info --config=tsan bazel-testlogs 2>/dev/null)

bash tools/fuzz.sh --junit "$out/fuzz.xml" || rc=1

python3 tools/summarize_tests.py "$(bazel info bazel-testlogs 2>/dev/null)" \
  "$out/targets" "$out/pytest.xml" "$out/fuzz.xml" \
  "$out/asan_pytest.xml" "$out/asan_reports.xml" "$out/tsan_reports.xml" \
  --also-catch2 "$asan_logs" "$out/targets" \
  --also-catch2 "$tsan_logs" "$out/targets" || rc=1
exit $rc
