#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (--config=fuzz:
# ASan + UBSan, in an output base of its own beside the main one, since
# CC=clang re-configures the C++ toolchain) and runs each for a bounded time
# from its seed corpus (tests/fuzz/corpus/<target>). Any finding (crash,
# sanitizer report, leak, timeout, out-of-memory) fails that target; its
# reproducer and log are kept under the results directory.
#
#   tools/fuzz.sh [--seconds N] [--results DIR] [--junit FILE] [TARGET...]
#
# --junit writes one JUnit test case per target (tools/summarize_tests.py
# counts them). Reproduce a finding with the same binary:
#   <bin>/tests/fuzz/<target>_fuzzer <results>/<target>-crash-...
# or, with gcc and no libFuzzer: bazel run //tests/fuzz:<target>_fuzzer -- FILE
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=${KREG_FUZZ_SECONDS:-10}
results=""
junit=""
targets=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --junit) junit=$2; shift 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=(session ring_decoder
  broker_request control_frames readopt_offer repoint_ack journal module_path elf_symbols
  http_request cluster_inputs signed_record compile_inputs handler_spec)
[[ -n $results ]] || results=$(mktemp -d /tmp/kreg-fuzz-results.XXXXXX)
mkdir -p "$results"

base="$(bazel info output_base 2>/dev/null)-fuzz"
fbazel() { nice bazel --output_base="$base" "$@"; }
labels=()
for t in "${targets[@]}"; do labels+=("//tests/fuzz:${t}_fuzzer"); done
build_ok=1
echo "fuzz: building ${targets[*]} with clang (log: $results/build.log)"
fbazel build --config=fuzz "${labels[@]}" >"$results/build.log" 2>&1 || build_ok=0
bin=$(fbazel info --config=fuzz bazel-bin 2>/dev/null)
# Its server is not needed again; give its memory back.
fbazel shutdown >/dev/null 2>&1

# Scratch files of the harnesses (journals, path fixtures) on tmpfs when
# possible: the journal target fsyncs on every input.
scratch=$(mktemp -d "$([[ -w /dev/shm ]] && echo /dev/shm || echo /tmp)/kreg-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

declare -A verdict why secs
for t in "${targets[@]}"; do
  exe="$bin/tests/fuzz/${t}_fuzzer"
  if ((!build_ok)) || [[ ! -x $exe ]]; then
    verdict[$t]=fail why[$t]="did not build (see $results/build.log)" secs[$t]=0
    echo "fuzz: $t: FAILED: ${why[$t]}"
    continue
  fi
  work="$scratch/$t"
  mkdir -p "$work/corpus" "$work/tmp"
  start=$SECONDS
  # Seeds are read-only inputs; new inputs go to the scratch corpus.
  TMPDIR="$work/tmp" \
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:strict_string_checks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    timeout -k 10 $((seconds + 60)) "$exe" -max_total_time="$seconds" \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$results/$t-" "$work/corpus" "tests/fuzz/corpus/$t" \
      >"$results/$t.log" 2>&1
  rc=$?
  secs[$t]=$((SECONDS - start))
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$results/$t.log" | grep -o '[0-9]*$')
  if ((rc == 0)); then
    verdict[$t]=pass
    echo "fuzz: $t: ok (${runs:-?} inputs in ${secs[$t]} s)"
  else
    verdict[$t]=fail
    why[$t]="exit $rc; $(grep -m1 -E 'ERROR: |runtime error|fuzz invariant|deadly signal' "$results/$t.log")"
    echo "fuzz: $t: FAILED (${why[$t]}); log and reproducer in $results"
    tail -n 40 "$results/$t.log"
  fi
done

failed=0
for t in "${targets[@]}"; do [[ ${verdict[$t]} == pass ]] || failed=$((failed + 1)); done
if [[ -n $junit ]]; then
  {
    echo '<?xml version="1.0" encoding="utf-8"?>'
    echo "<testsuites><testsuite name=\"fuzz\" tests=\"${#targets[@]}\" failures=\"$failed\">"
    for t in "${targets[@]}"; do
      echo -n "<testcase classname=\"fuzz\" name=\"${t}_fuzzer\" time=\"${secs[$t]}\">"
      if [[ ${verdict[$t]} != pass ]]; then
        msg=$(printf '%s' "${why[$t]}" | sed 's/&/\&amp;/g; s/</\&lt;/g; s/>/\&gt;/g; s/"/\&quot;/g')
        echo -n "<failure message=\"$msg\"/>"
      fi
      echo "</testcase>"
    done
    echo "</testsuite></testsuites>"
  } >"$junit"
fi
echo "fuzz: ${#targets[@]} targets, $failed failed (results: $results)"
((failed == 0))
