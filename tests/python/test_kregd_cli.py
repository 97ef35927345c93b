"""kregd's own command line for operators: --check-config and
--print-default-config (validate or show a configuration without starting),
SIGHUP (logged, not silently ignored) and UTC log times."""

import re
import signal
import subprocess
import time

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
