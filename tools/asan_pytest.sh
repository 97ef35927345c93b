#!/usr/bin/env bash
# DESIGN §6 (hostile input): the Python suites that drive kregd hardest from real JAX clients
# (sessions, registrations, the launch ring, status pages, the CLI) against
# an ASan + UBSan + LSan build of kregd, kregd-exec, kregd-probe and
# kregd-compile (the
# shim and the kernels stay plain: they load into Python). Every report the
# sanitizers write (log_path) fails the run.
#
#   tools/asan_pytest.sh OUT_DIR
#
# Writes OUT_DIR/asan_pytest.xml (the tests) and OUT_DIR/asan_reports.xml
# (one test case: "no sanitizer reports"), for tools/summarize_tests.py.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/asan_pytest.sh OUT_DIR}
mkdir -p "$out"
bazel build --config=asan //daemon/kregd:kregd //daemon/executor:kregd-probe \
  //daemon/kregd:kregd_next_minor //daemon/kregd:kregd_next_major \
  //daemon/kregd:kregd_tamper_local \
  //daemon/executor:kregd-exec //daemon/kregd_compile:kregd-compile //client/kregctl ||
  exit 1
asan_bin=$(bazel info --config=asan bazel-bin 2>/dev/null)
logs=$(mktemp -d)
export KREG_BIN_DIR="$PWD/bazel-bin"
export KREG_KERNELS_DIR="$PWD/bazel-bin/kernels/cpu"
export KREG_CLIENT_LIB="$PWD/bazel-bin/client/shim/libkreg_client.so"
export KREGD_BINARY="$asan_bin/daemon/kregd/kregd"
# handle_segv=0: a handler's segfault in an executor ends it with SIGSEGV
# (what kregd reports), not with an ASan report about the kernel's bug.
export ASAN_OPTIONS="log_path=$logs/asan:handle_segv=0:detect_leaks=1"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1"
rc=0
.venv/bin/python -m pytest -q -rs -p no:cacheprovider \
  --junitxml="$out/asan_pytest.xml" \
  tests/python/test_kreg_client.py tests/python/test_forwarded.py \
  tests/python/test_metrics.py tests/python/test_ops_cli.py \
  tests/python/test_local_execution.py tests/python/test_orphans.py \
  tests/python/test_compile.py || rc=1
reports=$(grep -lE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" \
  "$logs"/* 2>/dev/null)
if [[ -n $reports ]]; then
  echo "asan_pytest: sanitizer reports from kregd's processes:" >&2
  for f in $reports; do echo "== $f" >&2; head -60 "$f" >&2; done
  failure='<failure message="sanitizer reports; see the log"/>'
  rc=1
else
  failure=''
fi
cat >"$out/asan_reports.xml" <<XML
<testsuites><testsuite name="asan_pytest"><testcase classname="asan_pytest" name="no sanitizer reports in kregd, kregd-exec, kregd-probe">$failure</testcase></testsuite></testsuites>
XML
rm -rf "$logs"
exit $rc
