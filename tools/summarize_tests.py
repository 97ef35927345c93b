#!/usr/bin/env python3
"""Counts test cases across Bazel's Catch2 logs and JUnit XML files (pytest's,
tools/fuzz.sh's: one case per fuzz target) and prints one line:
`tests: N passed, N failed`, after a line `tests skipped: N` with the
skipped cases' reasons (GPU suites without a GPU, cluster tests without etcd,
...) on stderr, so a run that skipped a suite does not pass for a full one.

    summarize_tests.py TESTLOGS TARGETS [XML...] [--also-catch2 TESTLOGS TARGETS]...

--also-catch2 adds another run of Catch2 suites (e.g. `bazel test
--config=asan`, whose logs live in their own directory); its test cases count
again. A Catch2 case that skips says so with `WARN("skipped: REASON")` and
returns: it counts as skipped, not passed. A Bazel test target whose log has
no Catch2 summary (it crashed, timed out or did not build) counts as one
failed test case, and so does one whose cases all passed but whose process
failed after them (Bazel's test.xml says so: e.g. a LeakSanitizer report at
exit).

--failed-stage NAME:CODE (tools/test.sh passes one per stage whose command
exited non-zero) counts one failed test case each, so a stage that failed
outside any test case (a build, a sanitizer check) cannot end in "0 failed".
"""
import collections
import pathlib
import re
import sys
import xml.etree.ElementTree as ET

ALL_PASSED = re.compile(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)")
# "failed" is left out when none did (e.g. cases without assertions).
SUMMARY = re.compile(
    r"test cases:\s+(\d+) \|\s+(\d+) passed(?: \|\s+(\d+) failed)?")
# A Catch2 WARN("skipped: ...") as the console reporter prints it.
SKIPPED = re.compile(r"warning:\s*\n\s+skipped: ([^\n]*)")


def catch2(testlogs: pathlib.Path, targets: list[str], skips: collections.Counter):
    """Passed and failed cases of Catch2 targets; adds their skips' reasons."""
    passed = failed = 0
    for target in targets:
        log = testlogs / target.lstrip("/").replace(":", "/") / "test.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        skipped = SKIPPED.findall(text)
        for reason in skipped:
            skips[f"{target}: {reason}"[:160]] += 1
        passed -= len(skipped)
        if m := ALL_PASSED.search(text):
            passed += int(m.group(2))
            case_failures = 0
        elif m := SUMMARY.search(text):
            passed += int(m.group(2))
            case_failures = int(m.group(3) or 0)
        else:
            print(f"summarize: {target}: no Catch2 summary in {log}; counted as 1 failure",
                  file=sys.stderr)
            failed += 1
            continue
        failed += case_failures
        if not case_failures and bazel_failed(log.with_name("test.xml")):
            print(f"summarize: {target}: its cases passed but Bazel marks the test failed"
                  f" (a report at exit?); counted as 1 failure, see {log}", file=sys.stderr)
            failed += 1
    return passed, failed


def bazel_failed(xml: pathlib.Path) -> bool:
    """Whether Bazel's test.xml of a target records a failure or an error."""
    if not xml.exists():
        return False
    suites = ET.parse(xml).getroot().iter("testsuite")
    return any(int(s.get("failures") or 0) + int(s.get("errors") or 0) for s in suites)


def pytest(xml: pathlib.Path, skips: collections.Counter):
    """Passed and failed cases of a JUnit file; adds its skips' reasons."""
    if not xml.exists():
        print(f"summarize: {xml} is missing; counted as 1 failure", file=sys.stderr)
        return 0, 1
    passed = failed = 0
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            failed += 1
        elif (skipped := case.find("skipped")) is not None:
            skips[(skipped.get("message") or "no reason given")[:160]] += 1
        else:
            passed += 1
    return passed, failed


def main():
    args = sys.argv[1:]
    runs = []  # (testlogs, targets file) of each Catch2 run
    while "--also-catch2" in args:
        i = args.index("--also-catch2")
        runs.append((args[i + 1], args[i + 2]))
        del args[i:i + 3]
    stages = []  # "NAME:CODE" of each stage that exited non-zero
    while "--failed-stage" in args:
        i = args.index("--failed-stage")
        stages.append(args[i + 1])
        del args[i:i + 2]
    runs.insert(0, (args[0], args[1]))
    xmls = [pathlib.Path(p) for p in args[2:]]
    p = f = 0
    skips = collections.Counter()
    for testlogs, targets in runs:
        dp, df = catch2(pathlib.Path(testlogs),
                        pathlib.Path(targets).read_text().split(), skips)
        print(f"summarize: Catch2 in {testlogs}: {dp} passed, {df} failed",
              file=sys.stderr)
        p, f = p + dp, f + df
    for xml in xmls:
        dp, df = pytest(xml, skips)
        print(f"summarize: {xml.name}: {dp} passed, {df} failed", file=sys.stderr)
        p, f = p + dp, f + df
    for stage in stages:
        name, _, code = stage.partition(":")
        print(f"summarize: stage {name} exited {code}; counted as 1 failure (its log says why)",
              file=sys.stderr)
        f += 1
    for reason, n in skips.most_common():
        print(f"summarize: skipped {n}: {reason}", file=sys.stderr)
    print(f"tests skipped: {sum(skips.values())}")
    print(f"tests: {p} passed, {f} failed")
    return 1 if f else 0


if __name__ == "__main__":
    sys.exit(main())
