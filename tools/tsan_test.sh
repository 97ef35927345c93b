#!/usr/bin/env bash
# The Catch2 suites under ThreadSanitizer (--config=tsan), with abseil built
# with TSan (tools/tsan_absl.sh, cached) swapped in through LD_LIBRARY_PATH
# for the test binaries and every kregd, kregd-exec and kregd-probe they
# start. Debian's gRPC and protobuf stay uninstrumented: tools/tsan.supp
# says what that needs. Every TSan report of any of these processes
# (log_path) fails the run and is printed.
#
#   tools/tsan_test.sh OUT_DIR TARGETS_FILE
#
# TARGETS_FILE lists the test targets (`bazel query 'tests(//...)'`); all
# run. Writes OUT_DIR/tsan_reports.xml (one test case: "no TSan reports")
# for tools/summarize_tests.py; the Catch2 logs are in
# `bazel info --config=tsan bazel-testlogs`.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/tsan_test.sh OUT_DIR TARGETS_FILE}
targets_file=${2:?usage: tools/tsan_test.sh OUT_DIR TARGETS_FILE}
mkdir -p "$out"

report_xml() {  # $1: failure message, or empty
  local failure=""
  [[ -n $1 ]] && failure="<failure message=\"$1\"/>"
  cat >"$out/tsan_reports.xml" <<XML
<testsuites><testsuite name="tsan"><testcase classname="tsan" name="no TSan reports in the Catch2 suites and the kregd processes they start">$failure</testcase></testsuite></testsuites>
XML
}

absl=$(bash tools/tsan_absl.sh | tail -1) && [[ -d $absl/lib ]] || {
  echo "tsan_test: no TSan build of abseil; TSan stage not run" >&2
  report_xml "no TSan build of abseil"
  exit 1
}

logs=$(mktemp -d)
# kregd-exec and kregd-probe may run as another user: they write here too.
chmod 1777 "$logs"
# exitcode=66: a process with a report fails its test; halt_on_error=0: it
# goes on, so one run collects every report. handle_segv=0: the probe of a
# deliberately broken module dies of SIGSEGV (what kregd reports), not of a
# TSan report about it.
opts="log_path=$logs/tsan:exitcode=66:halt_on_error=0:handle_segv=0"
opts+=":second_deadlock_stack=1:suppressions=$PWD/tools/tsan.supp"
tsan=(--config=tsan "--test_env=LD_LIBRARY_PATH=$absl/lib"
  "--test_env=TSAN_OPTIONS=$opts")

# The launch-ring cases of cuda_launch_test check what the session's ring
# thread wrote, ordered only by the ring's atomics in a memfd that the test
# (as the client) and the session map at two addresses. TSan does not model
# aliased mappings, so each such check is a false report; the other cases
# of the suite run (launch_ring_test covers the ring under TSan).
ring_split=//tests/daemon/executor:cuda_launch_test
rc=0
nice bazel build "${tsan[@]}" $(cat "$targets_file") || rc=1
# The test binaries must load the TSan abseil, not Debian's. ldd's output
# is read whole first: `ldd | grep -q` under pipefail failed when grep's
# early exit sent ldd SIGPIPE (about 1 run in 100).
bin=$(bazel info --config=tsan bazel-bin 2>/dev/null)
libs=$(LD_LIBRARY_PATH=$absl/lib ldd "$bin/daemon/kregd/kregd")
if ! grep -q "libabsl_synchronization.so.* => $absl/lib/" <<<"$libs"; then
  echo "tsan_test: kregd does not load abseil from $absl/lib:" >&2
  echo "$libs" >&2
  rc=1
fi
nice bazel test "${tsan[@]}" $(grep -vxF "$ring_split" "$targets_file") || rc=1
if grep -qxF "$ring_split" "$targets_file"; then
  nice bazel test "${tsan[@]}" "--test_arg=~[ring]" "$ring_split" || rc=1
fi

reports=$(grep -l "WARNING: ThreadSanitizer" "$logs"/* 2>/dev/null)
if [[ -n $reports ]]; then
  echo "tsan_test: TSan reports (tests, kregd, kregd-exec, kregd-probe):" >&2
  for f in $reports; do echo "== $f" >&2; head -400 "$f" >&2; done
  report_xml "TSan reports; see the log"
  rc=1
else
  report_xml ""
fi
rm -rf "$logs"
exit $rc
