#!/usr/bin/env bash
# kregd never runs a handler (DESIGN §8): fails when //daemon:kregd links a
# target that runs handlers, naming the path from kregd to it. kregd-exec
# and kregd-probe are kregd's `data` (separate processes), so only what the
# binary's `deps` reach counts.
#
#   tools/check_kregd_deps.sh [--junit FILE]
#
# --junit FILE: also writes the result as one JUnit test case (counted by
# tools/summarize_tests.py).
set -uo pipefail
cd "$(dirname "$0")/.."
junit=""
[[ "${1:-}" == "--junit" ]] && junit=$2

# What runs handlers: FfiHost (and its call frames), the executor's session
# and launch executors, every CUDA session piece, the executor's backend.
forbidden='//daemon/ffi:ffi_host + //daemon/ffi:ffi_get_api
  + //daemon/session:session + //daemon/cuda:all
  + //daemon/exec:executor_backend + //daemon/exec:kregd-exec'
linked="deps(labels(deps, //daemon:kregd))"

query() { bazel query --noshow_progress "$@" 2>"$err"; }
err=$(mktemp)
trap 'rm -f "$err"' EXIT

fail=""
# The check must see the rule's targets at all: kregd-exec links FfiHost.
if ! sanity=$(query "deps(//daemon/exec:kregd-exec) intersect //daemon/ffi:ffi_host") ||
   [[ "$sanity" != *"//daemon/ffi:ffi_host"* ]]; then
  fail="bazel query could not see //daemon/exec:kregd-exec link //daemon/ffi:ffi_host: $(cat "$err")"
elif ! bad=$(query "$linked intersect ($forbidden)"); then
  fail="bazel query failed: $(cat "$err")"
elif [[ -n "$bad" ]]; then
  fail="//daemon:kregd links code that runs handlers (DESIGN §8):"
  for t in $bad; do
    path=$(query "somepath(labels(deps, //daemon:kregd), $t)" | tr '\n' ' ')
    fail+=$'\n'"  $t: //daemon:kregd -> ${path% }"
  done
fi

if [[ -n "$junit" ]]; then
  python3 - "$junit" "$fail" <<'PY'
import sys
from xml.sax.saxutils import escape
path, fail = sys.argv[1], sys.argv[2]
body = f'<failure message="kregd links handler code">{escape(fail)}</failure>' if fail else ""
open(path, "w").write(
    '<testsuite name="kregd_deps" tests="1">'
    f'<testcase classname="tools.check_kregd_deps" name="kregd_links_no_handler_code">{body}</testcase>'
    "</testsuite>\n")
PY
fi
if [[ -n "$fail" ]]; then
  echo "$fail" >&2
  exit 1
fi
echo "kregd links no handler code: none of its deps is FfiHost, Session, a CUDA session piece or the executor backend"
