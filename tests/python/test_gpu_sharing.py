"""GPU sharing mode (DESIGN §8; docs/operator-guide.md "GPU sharing (MPS)"): `kregctl status` reports
`gpu_sharing: mps | time-sliced | none`, probed from kregd's
CUDA_MPS_PIPE_DIRECTORY. Real kregd and kregctl; the pipe directories are
real sockets in a temporary directory. On a host with a GPU the tests that
need "no GPU" skip (tests/gpu/test_gpu_sharing_gpu.py covers that side)."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile

import pytest

from kregd_proc import Daemon, kregctl_binary


@pytest.fixture
def root():
  d = pathlib.Path(tempfile.mkdtemp(prefix="kreg-mps-", dir="/tmp"))
  yield d
  shutil.rmtree(d, ignore_errors=True)


def start(root: pathlib.Path, pipe_dir: str | None) -> Daemon:
  env = {k: v for k, v in os.environ.items()
         if k != "CUDA_MPS_PIPE_DIRECTORY"}
  if pipe_dir is not None:
    env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
  if kregctl_binary() is None:
    pytest.skip("kregctl not built (bazel build //client/kregctl)")
  d = Daemon(root, [], env=env)
  try:
    d.start()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  return d


def status_text(d: Daemon) -> str:
  r = subprocess.run([str(kregctl_binary()), "--socket", d.socket, "status"],
                     capture_output=True, text=True, timeout=30)
  assert r.returncode == 0, r.stderr
  return r.stdout


def stale_pipe_dir(root: pathlib.Path) -> pathlib.Path:
  """A pipe directory whose control socket's daemon is gone: the socket
  file stays, nothing listens on it."""
  pipe = root / "mps-pipe"
  pipe.mkdir()
  s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  s.bind(str(pipe / "control"))
  s.listen(1)
  s.close()
  assert (pipe / "control").is_socket()
  return pipe


def skip_with_gpu(status: dict) -> None:
  if status["gpu_sharing"] != "none":
    pytest.skip("this host has a GPU (tests/gpu/test_gpu_sharing_gpu.py covers "
                f"it): {status['gpu_sharing_note']}")


def test_status_reports_none_without_a_gpu(root):
  d = start(root, str(root / "no-mps-here"))
  try:
    js = d.status()
    skip_with_gpu(js)
    assert js["gpu_sharing"] == "none"
    assert js["gpu_sharing_note"].startswith("no GPU: "), js
    assert f"{root}/no-mps-here/control does not exist" in \
        js["gpu_sharing_note"]
    text = status_text(d)
    assert "gpu_sharing: none\n" in text, text
    assert "gpu_sharing_note: no GPU: " in text, text
    # At start: the mode in the log, and no MPS warning without a GPU.
    assert "GPU sharing: none (no GPU: " in d.log()
    assert "time-sliced" not in d.log()
  finally:
    d.stop()


def test_a_stale_mps_pipe_dir_is_not_mps(root):
  pipe = stale_pipe_dir(root)
  d = start(root, str(pipe))
  try:
    js = d.status()
    assert js["gpu_sharing"] != "mps", js
    assert f"{pipe}/control is stale" in js["gpu_sharing_note"], js
    assert "connect: Connection refused" in js["gpu_sharing_note"], js
  finally:
    d.stop()


def test_a_live_control_socket_is_seen_and_a_gone_one_is_noticed(root):
  """The probe runs at each status: a control daemon (here a listening
  socket standing in for it) that appears or goes away after kregd started
  is reported as it is now. Without a GPU the mode stays "none"; the note
  says what the probe found. Not run with a GPU: kregd's CUDA would try to
  talk to the stand-in."""
  pipe = root / "mps-pipe"
  pipe.mkdir()
  d = start(root, str(pipe))
  try:
    js = d.status()
    skip_with_gpu(js)
    assert f"{pipe}/control does not exist" in js["gpu_sharing_note"]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(pipe / "control"))
    s.listen(4)
    try:
      js = d.status()
      assert js["gpu_sharing"] == "none"
      assert f"MPS control daemon at {pipe}/control" in \
          js["gpu_sharing_note"], js
    finally:
      s.close()
    js = d.status()
    assert f"{pipe}/control is stale" in js["gpu_sharing_note"], js
  finally:
    d.stop()
