"""A kregd process on a private socket and state directory, for tests and
benchmarks (tests/python/conftest.py, tests/gpu, bench/bench_gpu.py).

The daemon binary is $KREGD_BINARY, by default <repo>/bazel-bin/daemon/kregd/kregd
(in a GPU bundle, env.sh sets it); kregctl is the one next to it. A daemon is
started as `kregd --socket S --state-dir D --allow-root R... [extra args]`
with its stdout and stderr appended to <root>/kregd.log.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional, Sequence

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# Where `import kreg` finds the package in a source checkout: its sources
# and the protobuf modules Bazel generates for it (client/python/BUILD).
KREG_PATH = [str(REPO_ROOT / "client" / "python"),
             str(pathlib.Path(os.environ.get("KREG_BIN_DIR",
                                             REPO_ROOT / "bazel-bin")) /
                 "client" / "python")]


def daemon_binary() -> pathlib.Path:
  env = os.environ.get("KREGD_BINARY")
  return pathlib.Path(env) if env else REPO_ROOT / "bazel-bin/daemon/kregd/kregd"


def kregctl_binary() -> Optional[pathlib.Path]:
  """kregctl next to the daemon binary under test, else the repo's; None
  when neither is built."""
  for p in (daemon_binary().parents[2] / "client" / "kregctl" / "kregctl",
            REPO_ROOT / "bazel-bin" / "client" / "kregctl" / "kregctl"):
    if p.is_file():
      return p
  return None


class Daemon:
  """A kregd process on a private socket and state directory.

  `extra_args` are appended to kregd's command line (e.g. `--log-level
  debug`); `env` replaces the environment kregd runs in (default: this
  process's)."""

  def __init__(self, root: pathlib.Path, allow_roots: Sequence[str],
               extra_args: Sequence[str] = (),
               env: Optional[dict[str, str]] = None):
    self.root = root
    # Another kregd build to start (the upgrade tests); None: kregd.
    self.binary: Optional[pathlib.Path] = None
    # Tests stop many daemons while their own process keeps sessions open:
    # executors outliving kregd (DESIGN §12, orphan_timeout) are what
    # tests/python/test_orphans.py asks for; elsewhere they stop with kregd.
    extra_args = list(extra_args)
    if not any(a.startswith("--orphan-timeout") for a in extra_args):
      extra_args += ["--orphan-timeout", "0"]
    self.socket = str(root / "kregd.sock")
    self.session_socket = self.socket + ".session"
    self.state_dir = str(root / "state")
    self.allow_roots = list(allow_roots)
    self.extra_args = list(extra_args)
    self.daemon_env = env
    self.log_path = root / "kregd.log"
    self.proc: subprocess.Popen | None = None

  def start(self, timeout: float = 30.0) -> None:
    """Starts kregd and waits until its session socket accepts connections.
    FileNotFoundError when the binary is not built; RuntimeError (with the
    log) when it exits or does not listen in time."""
    binary = self.binary or daemon_binary()
    if not binary.is_file():
      raise FileNotFoundError(
          f"{binary} not built (bazel build //daemon/kregd:kregd)")
    args = [str(binary), "--socket", self.socket, "--state-dir",
            self.state_dir]
    for r in self.allow_roots:
      args += ["--allow-root", r]
    args += self.extra_args
    with open(self.log_path, "ab") as log:
      self.proc = subprocess.Popen(args, stdout=log, stderr=log,
                                   stdin=subprocess.DEVNULL,
                                   env=self.daemon_env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if self.proc.poll() is not None:
        raise RuntimeError(f"kregd exited with {self.proc.returncode}:\n" +
                           self.log())
      if self._connectable():
        return
      time.sleep(0.02)
    self.stop()
    raise RuntimeError("kregd did not open its session socket:\n" + self.log())

  def _connectable(self) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
      s.connect(self.session_socket)
      return True
    except OSError:
      return False
    finally:
      s.close()

  def stop(self, sig: int = signal.SIGTERM) -> None:
    if self.proc is None:
      return
    if self.proc.poll() is None:
      self.proc.send_signal(sig)
      try:
        self.proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
    self.proc = None

  def restart(self) -> None:
    self.stop()
    self.start()

  def running(self) -> bool:
    return self.proc is not None and self.proc.poll() is None

  @property
  def pid(self) -> int:
    assert self.proc is not None
    return self.proc.pid

  def log(self, tail: Optional[int] = 8000) -> str:
    """The end of kregd's log (`tail` characters; None: all of it)."""
    try:
      text = self.log_path.read_text(errors="replace")
    except OSError:
      return ""
    return text if tail is None else text[-tail:]

  def status(self) -> dict:
    """`kregctl status --json` of this daemon (gRPC: opens no session)."""
    kregctl = kregctl_binary()
    if kregctl is None:
      raise FileNotFoundError("kregctl not built (bazel build //client/kregctl)")
    out = subprocess.run([str(kregctl), "--socket", self.socket, "status",
                          "--json"], capture_output=True, text=True,
                         timeout=30, check=True)
    return json.loads(out.stdout)

  def env(self) -> dict[str, str]:
    """Environment for a child JAX process that uses this daemon."""
    env = dict(os.environ)
    env["KREGD_SOCKET"] = self.socket
    env["PYTHONPATH"] = os.pathsep.join(
        KREG_PATH + [str(pathlib.Path(__file__).resolve().parent),
                     env.get("PYTHONPATH", "")])
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def run_kregctl(d: Daemon, *args: str,
                check: bool = True) -> subprocess.CompletedProcess:
  """`kregctl --socket <d's socket> ARGS...` (pytest.skip when kregctl is
  not built); with `check`, asserts it succeeded."""
  import pytest  # only the test suites use this helper
  exe = kregctl_binary()
  if exe is None:
    pytest.skip("kregctl not built")
  p = subprocess.run([str(exe), "--socket", d.socket, *args],
                     capture_output=True, text=True, timeout=60)
  if check:
    assert p.returncode == 0, p.stdout + p.stderr
  return p


def start_test_daemon(prefix: str, extra_args: Sequence[str] = ()) -> Daemon:
  """A started kregd under a fresh /tmp directory that may read the test
  kernels (pytest.skip when the binary is not built). Stop it with
  finish_test_daemon."""
  import pytest  # only the test suites use this helper
  import kernels_util as ku
  root = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
  d = Daemon(root, [os.path.realpath(ku.kernels_dir())], list(extra_args))
  try:
    d.start()
  except FileNotFoundError as e:
    shutil.rmtree(root, ignore_errors=True)
    pytest.skip(str(e))
  return d


def finish_test_daemon(d: Daemon) -> None:
  """Stops `d` and removes its directory (kept with KREG_KEEP_TEST_DIRS)."""
  d.stop()
  if os.environ.get("KREG_KEEP_TEST_DIRS") is None:
    shutil.rmtree(d.root, ignore_errors=True)
