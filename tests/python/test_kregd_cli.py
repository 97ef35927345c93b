"""kregd's own command line for operators: --check-config and
--print-default-config (validate or show a configuration without starting),
SIGHUP (logged, not silently ignored) and UTC log times."""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import kregd_proc
from kregd_proc import daemon_binary


def kregd(*args):
  return subprocess.run([str(daemon_binary()), *args], capture_output=True,
                        text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_print_default_config_is_a_config_check_config_accepts(tmp_path):
  r = kregd("--print-default-config")
  assert r.returncode == 0, r.stderr
  assert re.search(r'^max_module_bytes = 536870912  # default$', r.stdout,
                   re.M), r.stdout
  (tmp_path / "k.toml").write_text(r.stdout)
  c = kregd("--check-config", "--config", str(tmp_path / "k.toml"))
  assert c.returncode == 0, c.stderr
  assert "the configuration is valid" in c.stderr


def test_check_config_prints_the_effective_config_with_origins(tmp_path):
  (tmp_path / "k.toml").write_text("max_module_bytes = 4194304\n")
  r = kregd("--check-config", "--config", str(tmp_path / "k.toml"),
            "--log-level", "debug")
  assert r.returncode == 0, r.stderr
  assert f"max_module_bytes = 4194304  # {tmp_path / 'k.toml'}" in r.stdout
  assert 'log_level = "debug"  # --log-level' in r.stdout
  # Nothing was started: no socket, no state directory.
  assert not list(tmp_path.glob("*.sock*"))


def test_check_config_refuses_a_bad_value_with_status_2(tmp_path):
  (tmp_path / "k.toml").write_text('max_module_bytes = "big"\n')
  r = kregd("--check-config", "--config", str(tmp_path / "k.toml"))
  assert r.returncode == 2
  assert 'key "max_module_bytes" must be a positive integer' in r.stderr
  assert r.stdout == ""


def test_sighup_is_logged_and_kregd_keeps_serving():
  d = kregd_proc.start_test_daemon("kreg-sighup-")
  try:
    d.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while "SIGHUP" not in d.log() and time.monotonic() < deadline:
      time.sleep(0.05)
    assert "SIGHUP: kregd does not reload its configuration" in d.log()
    assert d.running()
    assert d.status()["version"]
    # Log times are UTC, marked Z (kregctl prints UTC too).
    first = d.log(None).splitlines()[0]
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", first), first
  finally:
    kregd_proc.finish_test_daemon(d)


def test_kregctl_says_why_it_cannot_read_a_module_file(tmp_path):
  d = kregd_proc.start_test_daemon("kreg-modfile-")
  try:
    missing = tmp_path / "nope.so"
    r = kregd_proc.run_kregctl(d, "register", "x.y", "--module", str(missing),
                               "--function", "F", "--platform", "cpu",
                               check=False)
    assert r.returncode == 2
    assert (f'cannot read module file "{missing}": No such file or directory'
            in r.stderr), r.stderr
    r = kregd_proc.run_kregctl(d, "register", "x.y", "--module",
                               str(tmp_path), "--function", "F", "--platform",
                               "cpu", check=False)
    assert r.returncode == 2
    assert f'cannot read module file "{tmp_path}": it is a directory' \
        in r.stderr, r.stderr
  finally:
    kregd_proc.finish_test_daemon(d)


def test_a_user_kregd_on_the_system_state_dir_says_how_to_run_its_own():
  if os.geteuid() != 0:
    pytest.skip("needs root: kregd runs as uid 65534")
  # A directory uid 65534 can reach (pytest's tmp_path is root's 0700).
  tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="kreg-userd-", dir="/tmp"))
  tmp_path.chmod(0o755)
  state = tmp_path / "system-state"
  state.mkdir(mode=0o700)  # root's, like /var/lib/kregd
  kregd_copy = tmp_path / "kregd"
  shutil.copy(daemon_binary(), kregd_copy)
  kregd_copy.chmod(0o755)
  r = subprocess.run([str(kregd_copy), "--state-dir", str(state / "kregd"),
                      "--socket", str(tmp_path / "k.sock")],
                     capture_output=True, text=True, timeout=60, user=65534,
                     group=65534, extra_groups=[], stdin=subprocess.DEVNULL,
                     env={"PATH": "/usr/bin:/bin"})
  shutil.rmtree(tmp_path, ignore_errors=True)
  assert r.returncode == 1, r.stderr
  assert "kregd runs as uid 65534, which may not use the state directory " \
      f"{state / 'kregd'}: for a kregd of your own pass --state-dir" \
      in r.stderr, r.stderr
