"""Fixtures for the forwarded (kregd) tests: a real daemon on a temp socket.

The daemon binary is $KREGD_BINARY, by default <repo>/bazel-bin/daemon/kregd
(`bazel build //daemon:kregd //daemon:kregd-probe //client/shim:libkreg_client.so
//kernels/cpu:all`). It is started as
`kregd --socket S --state-dir D --allow-root <kernels dir>`.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "client" / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def daemon_binary() -> pathlib.Path:
  env = os.environ.get("KREGD_BINARY")
  return pathlib.Path(env) if env else REPO_ROOT / "bazel-bin/daemon/kregd"


class Daemon:
  """A kregd process on a private socket and state directory."""

  def __init__(self, root: pathlib.Path, allow_roots: list[str]):
    self.root = root
    self.socket = str(root / "kregd.sock")
    self.session_socket = self.socket + ".session"
    self.state_dir = str(root / "state")
    self.allow_roots = allow_roots
    self.log_path = root / "kregd.log"
    self.proc: subprocess.Popen | None = None

  def start(self, timeout: float = 30.0) -> None:
    binary = daemon_binary()
    if not binary.is_file():
      pytest.skip(f"{binary} not built (bazel build //daemon:kregd)")
    args = [str(binary), "--socket", self.socket, "--state-dir",
            self.state_dir]
    for r in self.allow_roots:
      args += ["--allow-root", r]
    log = open(self.log_path, "ab")
    self.proc = subprocess.Popen(args, stdout=log, stderr=log,
                                 stdin=subprocess.DEVNULL)
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

  def log(self) -> str:
    try:
      return self.log_path.read_text(errors="replace")[-8000:]
    except OSError:
      return ""

  def env(self) -> dict[str, str]:
    """Environment for a child JAX process that uses this daemon."""
    env = dict(os.environ)
    env["KREGD_SOCKET"] = self.socket
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT / "client" / "python"),
         str(pathlib.Path(__file__).resolve().parent),
         env.get("PYTHONPATH", "")])
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def kernels_root() -> str:
  import kernels_util as ku  # pylint: disable=import-outside-toplevel
  return os.path.realpath(ku.kernels_dir())


@pytest.fixture
def kregctl_path():
  """kregctl next to the daemon binary under test, else the repo's; skips
  when neither is built. (A fixture: `import conftest` is ambiguous when
  several test directories run in one pytest process.)"""
  for p in (daemon_binary().parents[1] / "client" / "kregctl",
            REPO_ROOT / "bazel-bin" / "client" / "kregctl"):
    if p.is_file():
      return p
  pytest.skip("kregctl not built (bazel build //client:kregctl)")


@pytest.fixture
def second_kregd():
  """Another kregd (own socket and state), for tests that need two daemons.
  A fixture rather than `import conftest`: with several test directories in
  one pytest run, that name may resolve to another directory's conftest."""
  d = Daemon(pathlib.Path(tempfile.mkdtemp(prefix="kreg-", dir="/tmp")),
             [kernels_root()])
  d.start()
  try:
    yield d
  finally:
    d.stop()
    shutil.rmtree(d.root, ignore_errors=True)


@pytest.fixture(scope="session")
def kregd():
  # Unix socket paths are limited to 108 bytes: keep the directory short.
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-", dir="/tmp"))
  d = Daemon(root, [kernels_root()])
  d.start()
  yield d
  d.stop()
  if os.environ.get("KREG_KEEP_TEST_DIRS") is None:
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def kreg_client(kregd):
  import kreg  # pylint: disable=import-outside-toplevel
  return kreg.connect(kregd.socket)


@pytest.fixture
def running_kregd(kregd, kreg_client):
  """The session daemon, (re)started if an earlier test stopped it."""
  if not kregd.running():
    kregd.start()
  return kregd
