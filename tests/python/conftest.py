"""Fixtures for the forwarded (kregd) tests: a real daemon on a temp socket.

The daemon binary is $KREGD_BINARY, by default <repo>/bazel-bin/daemon/kregd/kregd
(`bazel build //daemon/kregd:kregd //daemon/executor:kregd-probe //client/shim:libkreg_client.so
//kernels/cpu:all`). It is started as
`kregd --socket S --state-dir D --allow-root <kernels dir>`.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

# The Daemon class lives in kregd_proc (shared with tests/gpu and bench/).
from kregd_proc import KREG_PATH, Daemon, kregctl_binary  # noqa: E402

sys.path[:0] = KREG_PATH


def start_or_skip(d: Daemon) -> None:
  """d.start(), skipping the test when kregd is not built."""
  try:
    d.start()
  except FileNotFoundError as e:
    pytest.skip(str(e))


def kernels_root() -> str:
  import kernels_util as ku  # pylint: disable=import-outside-toplevel
  return os.path.realpath(ku.kernels_dir())


@pytest.fixture
def kregctl_path():
  """kregctl next to the daemon binary under test, else the repo's; skips
  when neither is built. (A fixture: `import conftest` is ambiguous when
  several test directories run in one pytest process.)"""
  p = kregctl_binary()
  if p is None:
    pytest.skip("kregctl not built (bazel build //client/kregctl)")
  return p


@pytest.fixture
def second_kregd():
  """Another kregd (own socket and state), for tests that need two daemons.
  A fixture rather than `import conftest`: with several test directories in
  one pytest run, that name may resolve to another directory's conftest."""
  d = Daemon(pathlib.Path(tempfile.mkdtemp(prefix="kreg-", dir="/tmp")),
             [kernels_root()])
  start_or_skip(d)
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
  start_or_skip(d)
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
