"""Operability (DESIGN §5, docs/errors.md): versions, CLI exit codes and messages, log-level
rejection, not-runnable targets, environment mistakes, the one upload limit
and `python -m kreg`. Every test runs the real kregd / kregctl binaries."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import kernels_util as ku

REPO = pathlib.Path(__file__).resolve().parents[2]


def kregd_binary() -> pathlib.Path:
  env = os.environ.get("KREGD_BINARY")
  return pathlib.Path(env) if env else REPO / "bazel-bin/daemon/kregd/kregd"


def run(args, env=None, timeout=120, cwd=None):
  return subprocess.run([str(a) for a in args], capture_output=True,
                        text=True, env=env, timeout=timeout, cwd=cwd)


def py_child(code: str, env: dict, timeout=180):
  """Runs `code` in a fresh Python (the repo's venv) with `env`."""
  return run([sys.executable, "-c", textwrap.dedent(code)], env=env,
             timeout=timeout)


class OwnKregd:
  """A kregd with extra flags on a private socket (stopped by close())."""

  def __init__(self, *flags):
    binary = kregd_binary()
    if not binary.is_file():
      pytest.skip(f"{binary} not built")
    self.root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-ops-", dir="/tmp"))
    self.socket = str(self.root / "k.sock")
    self.log = self.root / "kregd.log"
    with open(self.log, "wb") as log:
      self.proc = subprocess.Popen(
          [str(binary), "--socket", self.socket, "--state-dir",
           str(self.root / "state"), *map(str, flags)],
          stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
      assert self.proc.poll() is None, self.log.read_text()
      # The gRPC socket (bound before the session socket): probing the
      # session socket would start an executor for nothing.
      s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
      try:
        if not os.path.exists(self.socket + ".session"):
          raise OSError("session socket not there yet")
        s.connect(self.socket)
        return
      except OSError:
        time.sleep(0.02)
      finally:
        s.close()
    raise RuntimeError("kregd did not start:\n" + self.log.read_text())

  def env(self) -> dict:
    env = dict(os.environ)
    env["KREGD_SOCKET"] = self.socket
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "client" / "python"), str(pathlib.Path(__file__).parent)])
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env

  def close(self):
    self.proc.send_signal(signal.SIGTERM)
    self.proc.wait(timeout=20)
    shutil.rmtree(self.root, ignore_errors=True)


# -- versions ----------------------------------------------------------------


def test_versions_agree_across_kregd_kregctl_and_kreg(kregctl_path):
  import kreg  # pylint: disable=import-outside-toplevel
  if not kregd_binary().is_file():
    pytest.skip("kregd not built")
  d = run([kregd_binary(), "--version"])
  c = run([kregctl_path, "--version"])
  m = run([sys.executable, "-m", "kreg", "--version"],
          env={**os.environ, "PYTHONPATH": str(REPO / "client/python")})
  assert (d.returncode, c.returncode, m.returncode) == (0, 0, 0)
  assert d.stdout.strip() == f"kregd {kreg.__version__}"
  assert c.stdout.strip() == f"kregctl {kreg.__version__}"
  assert m.stdout.strip() == f"kreg {kreg.__version__}"
  pyproject = (REPO / "client/python/pyproject.toml").read_text()
  assert f'version = "{kreg.__version__}"' in pyproject


# -- CLI usage errors --------------------------------------------------------


def test_kregctl_unknown_command_names_it_and_lists_commands(kregctl_path):
  r = run([kregctl_path, "foo"])
  assert r.returncode == 2
  assert "unknown command foo" in r.stderr
  for cmd in ("list", "show", "status", "health", "register"):
    assert cmd in r.stderr


def test_kregctl_unknown_command_after_global_option(kregctl_path):
  r = run([kregctl_path, "--socket", "/nonexistent.sock", "lsit"])
  assert r.returncode == 2
  assert "unknown command lsit" in r.stderr


@pytest.mark.parametrize("how", ["flag", "toml"])
def test_kregd_rejects_an_unknown_log_level(tmp_path, how):
  if not kregd_binary().is_file():
    pytest.skip("kregd not built")
  args = [kregd_binary(), "--socket", tmp_path / "k.sock", "--state-dir",
          tmp_path / "state"]
  if how == "flag":
    args += ["--log-level", "verbose"]
  else:
    (tmp_path / "k.toml").write_text('log_level = "verbose"\n')
    args += ["--config", tmp_path / "k.toml"]
  r = run(args, timeout=30)
  assert r.returncode == 2, r.stderr
  assert 'unknown log level "verbose"' in r.stderr
  assert "trace, debug, info, warn, error" in r.stderr
  assert not (tmp_path / "k.sock").exists()


def test_kregd_rejects_an_unknown_socket_group_as_a_config_error(tmp_path):
  # docs/operator-guide.md: any configuration mistake, an unknown group
  # included, stops kregd with exit status 2 and a message naming it.
  if not kregd_binary().is_file():
    pytest.skip("kregd not built")
  (tmp_path / "k.toml").write_text('socket_group = "no-such-group-kreg"\n')
  r = run([kregd_binary(), "--config", tmp_path / "k.toml", "--socket",
           tmp_path / "k.sock", "--state-dir", tmp_path / "state"], timeout=30)
  assert r.returncode == 2, r.stderr
  assert ('socket_group "no-such-group-kreg" (--socket-group or the config '
          'file) does not exist') in r.stderr
  assert not (tmp_path / "k.sock").exists()
  assert not (tmp_path / "state").exists()
  # The flag is the key's: the same refusal, not "unexpected argument".
  r = run([kregd_binary(), "--socket-group", "no-such-group-kreg",
           "--socket", tmp_path / "k.sock", "--state-dir", tmp_path / "state"],
          timeout=30)
  assert r.returncode == 2, r.stderr
  assert 'socket_group "no-such-group-kreg" (--socket-group' in r.stderr, (
      r.stderr)
  assert not (tmp_path / "state").exists()


def test_kregd_accepts_every_documented_log_level(tmp_path):
  if not kregd_binary().is_file():
    pytest.skip("kregd not built")
  for level in ("trace", "debug", "info", "warn", "error", "critical", "off"):
    d = OwnKregd("--log-level", level)
    d.close()


# -- mistakes that used to be silent -----------------------------------------


def test_cuda_target_on_a_kregd_without_gpu_is_marked_and_warned(
    running_kregd, kregctl_path):
  env = running_kregd.env()
  r = py_child(f"""
      import warnings, kreg
      kreg.connect()
      with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        kreg.register_ffi_target("ops.cuda_default", {str(ku.kernel_path(ku.DEMO))!r}, "Scale")
        kreg.register_ffi_target("ops.cuda_default", {str(ku.kernel_path(ku.DEMO))!r}, "Scale")
      t = [t for t in kreg.list_registered_targets()
           if t.target_name == "ops.cuda_default"][0]
      print("RUNNABLE", t.runnable, "|", t.not_runnable)
      print("WARNINGS", len([x for x in w
                             if issubclass(x.category, kreg.NotRunnableWarning)]))
      for x in w: print("W", x.message)
      """, env)
  assert r.returncode == 0, r.stderr
  if "RUNNABLE True" in r.stdout:
    pytest.skip("this kregd serves CUDA: cuda targets are runnable here")
  assert "RUNNABLE False | this kregd cannot run CUDA launches" in r.stdout
  assert "WARNINGS 1" in r.stdout  # once, not once per registration
  assert "platform=\"cpu\"" in r.stdout
  table = run([kregctl_path, "--socket", running_kregd.socket, "list"])
  assert table.returncode == 0
  row = [l for l in table.stdout.splitlines()
         if l.startswith("ops.cuda_default ")]
  assert row and row[0].split()[2] == "no", table.stdout
  assert "not runnable here: ops.cuda_default (cuda): this kregd cannot run " \
      "CUDA" in table.stdout
  js = json.loads(run([kregctl_path, "--socket", running_kregd.socket, "show",
                       "ops.cuda_default", "--json"]).stdout)
  assert js[0]["runnable"] is False and "CUDA" in js[0]["not_runnable"]


def test_cpu_target_is_runnable(running_kregd, kregctl_path):
  r = run([kregctl_path, "--socket", running_kregd.socket, "register",
           "ops.cpu_ok", "--module", ku.kernel_path(ku.DEMO), "--function",
           "Scale"])
  assert r.returncode == 0, r.stderr
  js = json.loads(run([kregctl_path, "--socket", running_kregd.socket, "show",
                       "ops.cpu_ok", "--json"]).stdout)
  assert js[0]["runnable"] is True and js[0]["not_runnable"] == ""


def test_kreg_client_lib_pointing_at_a_missing_file_is_an_error(
    running_kregd):
  env = running_kregd.env()
  env["KREG_CLIENT_LIB"] = "/nonexistent/libkreg_client.so"
  r = py_child("""
      import kreg
      try:
        kreg.connect()
      except kreg.ShimNotFoundError as e:
        print("ERR", e)
      """, env)
  assert r.returncode == 0, r.stderr
  assert "ERR KREG_CLIENT_LIB=/nonexistent/libkreg_client.so does not name " \
      "a file" in r.stdout


def test_kregd_socket_naming_the_session_socket_is_explained(
    running_kregd, kregctl_path):
  env = running_kregd.env()
  env["KREGD_SOCKET"] = running_kregd.session_socket
  r = run([kregctl_path, "list"], env=env)
  assert r.returncode == 2
  assert "is kregd's session socket" in r.stderr
  assert running_kregd.socket + "\n" in r.stderr  # the gRPC socket to use
  assert "HTTP/2" not in r.stderr
  p = py_child("""
      import kreg
      try:
        kreg.connect()
      except kreg.KregError as e:
        print("ERR", e.code, e)
      """, env)
  assert p.returncode == 0, p.stderr
  assert "ERR INVALID_ARGUMENT KREGD_SOCKET" in p.stdout
  assert "names kregd's session socket" in p.stdout


# -- one upload limit --------------------------------------------------------


def test_upload_limit_is_checked_before_sending_on_both_paths(
    kregctl_path, tmp_path):
  module = ku.kernel_path(ku.DEMO)
  limit = module.stat().st_size - 1
  d = OwnKregd("--max-module-bytes", limit)
  try:
    status = json.loads(run([kregctl_path, "--socket", d.socket, "status",
                             "--json"]).stdout)
    assert status["max_module_bytes"] == limit
    r = run([kregctl_path, "--socket", d.socket, "register", "ops.big",
             "--module", module, "--function", "Scale"])
    assert r.returncode == 2, r.stderr
    assert f"more than kregd's max_module_bytes ({limit}); nothing was sent" \
        in r.stderr
    # Outside the daemon's allowed roots (none here): uploaded by kreg.
    copy = tmp_path / "libdemo_copy.so"
    shutil.copy(module, copy)
    p = py_child(f"""
        import kreg
        kreg.connect()
        try:
          kreg.register_ffi_target("ops.big", {str(copy)!r}, "Scale",
                                   platform="cpu")
        except kreg.InvalidArgumentError as e:
          print("ERR", e.code, e)
        """, d.env())
    assert p.returncode == 0, p.stderr
    assert "ERR INVALID_ARGUMENT" in p.stdout
    assert f"exceeds kregd's max_module_bytes ({limit}); nothing was sent" \
        in p.stdout
    # Known before any session: from the control connection's hello.
    assert json.loads(run([kregctl_path, "--socket", d.socket, "status",
                           "--json"]).stdout)["executors_started"] == 0
    assert "ops.big" not in run([kregctl_path, "--socket", d.socket,
                                 "list"]).stdout
  finally:
    d.close()


def test_modules_above_the_old_64_mib_message_limit_register_on_both_paths(
    running_kregd, kregctl_path, tmp_path):
  # A real handler library padded past 64 MiB (what a CUDA fatbin can weigh).
  big = tmp_path / "libdemo_big.so"
  shutil.copy(ku.kernel_path(ku.DEMO), big)
  with open(big, "ab") as f:
    f.truncate(big.stat().st_size + (70 << 20))
  p = py_child(f"""
      import numpy as np, jax, jax.numpy as jnp, kreg
      kreg.connect()
      kreg.register_ffi_target("ops.big70", {str(big)!r}, "Scale",
                               platform="cpu")
      f = jax.jit(lambda x: jax.ffi.ffi_call(
          "ops.big70", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=3.0))
      print("OUT", np.asarray(f(jnp.arange(3, dtype=jnp.float32))).tolist())
      """, running_kregd.env(), timeout=300)
  assert p.returncode == 0, p.stderr
  assert "OUT [0.0, 3.0, 6.0]" in p.stdout
  r = run([kregctl_path, "--socket", running_kregd.socket, "register",
           "ops.big70_ctl", "--module", big, "--function", "Scale"],
          timeout=300)
  assert r.returncode == 0, r.stderr
  show = json.loads(run([kregctl_path, "--socket", running_kregd.socket,
                         "show", "ops.big70", "--json"]).stdout)
  assert show[0]["module_size"] == big.stat().st_size


# -- python -m kreg ----------------------------------------------------------


def test_python_m_kreg_list_show_status(running_kregd, kregctl_path):
  assert run([kregctl_path, "--socket", running_kregd.socket, "register",
              "ops.pym", "--module", ku.kernel_path(ku.DEMO), "--function",
              "Scale"]).returncode == 0
  env = running_kregd.env()
  ls = run([sys.executable, "-m", "kreg", "list"], env=env)
  assert ls.returncode == 0, ls.stderr
  assert re.search(r"^ops\.pym\s+cpu\s+yes\s+Scale", ls.stdout, re.M)
  show = run([sys.executable, "-m", "kreg", "show", "ops.pym", "--json"],
             env=env)
  assert show.returncode == 0
  assert json.loads(show.stdout)[0]["func_name"] == "Scale"
  missing = run([sys.executable, "-m", "kreg", "show", "ops.nope"], env=env)
  assert missing.returncode == 1 and 'no target "ops.nope"' in missing.stderr
  # A typo: close registered names; another platform: the ones it has.
  typo = run([kregctl_path, "--socket", running_kregd.socket, "show",
              "ops.pyn"])
  assert typo.returncode == 1
  assert 'no target "ops.pyn" is registered (did you mean "ops.pym"' \
      in typo.stderr, typo.stderr
  other = run([kregctl_path, "--socket", running_kregd.socket, "show",
               "ops.pym", "--platform", "cuda"])
  assert other.returncode == 1
  assert ('no target "ops.pym" on platform cuda is registered (registered '
          "for cpu only)") in other.stderr, other.stderr
  st = run([sys.executable, "-m", "kreg", "status", "--json"], env=env)
  assert st.returncode == 0, st.stderr
  info = json.loads(st.stdout)
  assert info["reachable"] is True and info["targets"] >= 1
  assert info["shim"].endswith("libkreg_client.so")


def test_python_m_kreg_exit_codes(tmp_path):
  env = {**os.environ, "PYTHONPATH": str(REPO / "client/python"),
         "KREGD_SOCKET": str(tmp_path / "none.sock")}
  down = run([sys.executable, "-m", "kreg", "status"], env=env)
  assert down.returncode == 4
  assert "kregd is not running or not reachable" in down.stderr
  usage = run([sys.executable, "-m", "kreg"], env=env)
  assert usage.returncode == 2
