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
