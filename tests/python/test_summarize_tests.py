"""tools/summarize_tests.py: the suite's last lines count passes, failures and
skips, with each skip's reason, so a run without a GPU or etcd does not read
as a full one."""

import pathlib
import subprocess
import sys

from kregd_proc import REPO_ROOT

JUNIT = """<?xml version="1.0"?>
<testsuites><testsuite name="pytest">
<testcase classname="a" name="ok"/>
<testcase classname="a" name="bad"><failure message="boom"/></testcase>
<testcase classname="a" name="gpu1"><skipped message="no CUDA GPU is visible"/></testcase>
<testcase classname="a" name="gpu2"><skipped message="no CUDA GPU is visible"/></testcase>
<testcase classname="a" name="etcd"><skipped message="etcd is not installed"/></testcase>
</testsuite></testsuites>
"""


def test_counts_passes_failures_and_skips_with_reasons(tmp_path):
  logs = tmp_path / "testlogs"
  (logs / "t" / "ok_test").mkdir(parents=True)
  (logs / "t" / "ok_test" / "test.log").write_text(
      "All tests passed (7 assertions in 3 test cases)\n")
  (tmp_path / "targets").write_text("//t:ok_test\n//t:missing_test\n")
  (tmp_path / "pytest.xml").write_text(JUNIT)
  r = subprocess.run(
      [sys.executable, str(REPO_ROOT / "tools" / "summarize_tests.py"),
       str(logs), str(tmp_path / "targets"), str(tmp_path / "pytest.xml")],
      capture_output=True, text=True)
  lines = r.stdout.strip().splitlines()
  # 3 Catch2 cases + 1 pytest pass; 1 pytest failure + 1 target without a log.
  assert lines[-1] == "tests: 4 passed, 2 failed", r.stdout
  assert lines[-2] == "tests skipped: 3", r.stdout
  assert "skipped 2: no CUDA GPU is visible" in r.stderr, r.stderr
  assert "skipped 1: etcd is not installed" in r.stderr, r.stderr
  assert r.returncode == 1


def test_catch2_cases_that_warn_skipped_count_as_skips(tmp_path):
  # What Catch2's console reporter prints for a case that WARNs
  # "skipped: ..." and returns (tests/daemon/executor/cuda/gpu_test.cc without a GPU).
  logs = tmp_path / "testlogs"
  (logs / "t" / "gpu_test").mkdir(parents=True)
  (logs / "t" / "gpu_test" / "test.log").write_text(
      "tests/daemon/executor/cuda/gpu_test.cc:18: warning:\n"
      "  skipped: no CUDA device: no CUDA driver\n\n"
      "tests/daemon/executor/cuda/gpu_test.cc:18: \nwarning:\n"
      "  skipped: no CUDA device: no CUDA driver\n\n"
      "test cases: 3 | 3 passed\nassertions: - none -\n")
  (tmp_path / "targets").write_text("//t:gpu_test\n")
  r = subprocess.run(
      [sys.executable, str(REPO_ROOT / "tools" / "summarize_tests.py"),
       str(logs), str(tmp_path / "targets")],
      capture_output=True, text=True)
  lines = r.stdout.strip().splitlines()
  assert lines[-1] == "tests: 1 passed, 0 failed", r.stdout
  assert lines[-2] == "tests skipped: 2", r.stdout
  assert "skipped 2: //t:gpu_test: no CUDA device: no CUDA driver" in r.stderr
  assert r.returncode == 0


def test_a_target_bazel_failed_after_its_cases_passed_and_a_failed_stage_count(tmp_path):
  # A LeakSanitizer report at exit: Catch2 printed "All tests passed", the
  # process exited non-zero, Bazel's test.xml records the failure.
  logs = tmp_path / "testlogs"
  (logs / "t" / "leaky_test").mkdir(parents=True)
  (logs / "t" / "leaky_test" / "test.log").write_text(
      "All tests passed (2 assertions in 2 test cases)\n"
      "ERROR: LeakSanitizer: detected memory leaks\n")
  (logs / "t" / "leaky_test" / "test.xml").write_text(
      '<testsuites><testsuite name="t/leaky_test" tests="1" failures="0" '
      'errors="1"><testcase name="t/leaky_test" status="run"><error '
      'message="exited with error code 1"/></testcase></testsuite></testsuites>')
  (tmp_path / "targets").write_text("//t:leaky_test\n")
  r = subprocess.run(
      [sys.executable, str(REPO_ROOT / "tools" / "summarize_tests.py"),
       str(logs), str(tmp_path / "targets"), "--failed-stage", "catch2-asan:3"],
      capture_output=True, text=True)
  lines = r.stdout.strip().splitlines()
  # 2 cases passed; the target's exit and the stage count one failure each.
  assert lines[-1] == "tests: 2 passed, 2 failed", r.stdout
  assert "//t:leaky_test: its cases passed but Bazel marks the test failed" in r.stderr
  assert "stage catch2-asan exited 3; counted as 1 failure" in r.stderr, r.stderr
  assert r.returncode == 1
