"""`kregctl config`: kregd's effective configuration as TOML with each
value's origin (docs/operator-guide.md, "Seeing the effective
configuration"), and the same as JSON."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import tempfile
import tomllib
from concurrent import futures

import pytest

from kregd_proc import (Daemon, finish_test_daemon, kregctl_binary,
                        run_kregctl, start_test_daemon)

REPO = pathlib.Path(__file__).resolve().parents[2]


def parse_keys() -> set[str]:
  """The keys ApplyToml parses: the rows of the key table in
  daemon/config/config_keys.cc (`KeyString("socket", ...`)."""
  return set(
      re.findall(r'\bKey(?:String|Strings|Bool|Int|Float|Custom)\(\s*"(\w+)"',
                 (REPO / "daemon/config/config_keys.cc").read_text()))


@pytest.fixture
def configured_kregd():
  """kregd with a config file (isolation, max_sessions, log_level) and a
  flag that overrides one of the file's keys (--log-level)."""
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-cfg-", dir="/tmp"))
  config = root / "kregd.toml"
  config.write_text('isolation = "uid"\nmax_sessions = 77\n'
                    'log_level = "warn"\n')
  d = Daemon(root, [], ["--config", str(config), "--log-level", "debug"])
  try:
    d.start()
  except FileNotFoundError as e:
    shutil.rmtree(root, ignore_errors=True)
    pytest.skip(str(e))
  try:
    yield d, config
  finally:
    finish_test_daemon(d)


def dump_lines(text: str) -> dict[str, tuple[str, str]]:
  """key -> (value literal, origin) of the `key = value  # origin` lines."""
  out = {}
  for line in text.splitlines():
    if line.startswith("#") or not line:
      continue
    m = re.fullmatch(r"(\w+) = (.*)  # (.*)", line)
    assert m, line
    out[m.group(1)] = (m.group(2), m.group(3))
  return out


def test_config_dump_names_values_and_origins(configured_kregd):
  d, config = configured_kregd
  text = run_kregctl(d, "config").stdout
  lines = dump_lines(text)
  # Every key a config file may set, no more.
  assert set(lines) == parse_keys()
  assert lines["isolation"] == ('"uid"', str(config))
  assert lines["max_sessions"] == ("77", str(config))
  # The flag wins over the file, and says so.
  assert lines["log_level"] == ('"debug"', "--log-level")
  assert lines["socket"] == (json.dumps(d.socket), "--socket")
  assert lines["orphan_timeout"] == ("0", "--orphan-timeout")
  assert lines["max_sessions_per_uid"] == ("256", "default")
  assert lines["seccomp"] == ("true", "default")
  assert lines["hello_timeout_s"] == ("10.0", "default")
  assert f"# config file: {config}\n" in text
  # Valid TOML, with the effective values.
  parsed = tomllib.loads(text)
  assert parsed["isolation"] == "uid" and parsed["max_sessions"] == 77
  assert parsed["log_level"] == "debug" and parsed["allowed_roots"] == []
  assert parsed["launch_timeout"] == 0.0 and parsed["launch_ring"] is True


def test_config_json_has_the_same_values_and_origins(configured_kregd):
  d, config = configured_kregd
  j = json.loads(run_kregctl(d, "config", "--json").stdout)
  assert j["config_file"] == str(config)
  values = j["values"]
  assert set(values) == parse_keys()
  assert values["isolation"] == {"value": "uid", "origin": str(config)}
  assert values["log_level"] == {"value": "debug", "origin": "--log-level"}
  assert values["max_sessions"] == {"value": 77, "origin": str(config)}
  assert values["allowed_roots"] == {"value": [], "origin": "default"}
  assert values["etcd_timeout_s"] == {"value": 5.0, "origin": "default"}


def test_kregd_accepts_its_dump_back(configured_kregd, tmp_path):
  d, _ = configured_kregd
  dump = tmp_path / "dump.toml"
  dump.write_text(run_kregctl(d, "config").stdout)
  # The dump names d's socket and state dir: a second kregd takes its own
  # from flags, everything else from the dump.
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-cfg2-", dir="/tmp"))
  d2 = Daemon(root, [], ["--config", str(dump)])
  try:
    d2.start()
    again = dump_lines(run_kregctl(d2, "config").stdout)
    first = dump_lines(dump.read_text())
    for key, (value, origin) in again.items():
      if key in ("socket", "state_dir", "orphan_timeout"):
        continue  # given again as flags (kregd_proc)
      assert value == first[key][0], key
      assert origin == str(dump), key
  finally:
    finish_test_daemon(d2)


def test_allowed_roots_from_file_and_flag_name_both(tmp_path):
  import kernels_util as ku  # pylint: disable=import-outside-toplevel
  kernels = str(pathlib.Path(ku.kernels_dir()).resolve())
  config = tmp_path / "k.toml"
  config.write_text(f'allowed_roots = ["{tmp_path}"]\n')
  d = start_test_daemon("kreg-cfg3-", ["--config", str(config)])
  try:
    lines = dump_lines(run_kregctl(d, "config").stdout)
    value, origin = lines["allowed_roots"]
    assert json.loads(value) == [str(tmp_path.resolve()), kernels]
    assert origin == f"{config}, --allow-root"
  finally:
    finish_test_daemon(d)


def test_env_origin_for_the_launch_ring(tmp_path):
  import os  # pylint: disable=import-outside-toplevel
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-cfg4-", dir="/tmp"))
  d = Daemon(root, [], env={**os.environ, "KREGD_RING_SPIN_US": "7"})
  try:
    d.start()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  try:
    lines = dump_lines(run_kregctl(d, "config").stdout)
    assert lines["ring_spin_us"] == ("7", "$KREGD_RING_SPIN_US")
  finally:
    finish_test_daemon(d)


def test_config_against_a_kregd_without_get_config(tmp_path):
  # A kregd older than `kregctl config` answers UNIMPLEMENTED (a gRPC server
  # with no services does the same).
  grpc = pytest.importorskip("grpc")
  exe = kregctl_binary()
  if exe is None:
    pytest.skip("kregctl not built")
  sock = tmp_path / "old.sock"
  server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
  server.add_insecure_port(f"unix:{sock}")
  server.start()
  try:
    p = subprocess.run([str(exe), "--socket", str(sock), "config"],
                       capture_output=True, text=True, timeout=60)
  finally:
    server.stop(None)
  assert p.returncode == 1, p.stderr
  assert (f"kregd at {sock} does not report its configuration: it predates "
          "`kregctl config`") in p.stderr
