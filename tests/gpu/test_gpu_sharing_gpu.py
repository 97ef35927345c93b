"""GPU sharing on a GPU host (DESIGN §8): kregd reports `gpu_sharing:
time-sliced` and warns at start when its MPS pipe directory has no live
control daemon (here: a stale control socket), and `mps` under the MPS
control daemon of tests/gpu/run.sh's "mps" pass (which sets
KREG_EXPECT_GPU_SHARING=mps and CUDA_MPS_PIPE_DIRECTORY). The no-GPU side is
tests/python/test_gpu_sharing.py."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kregd_proc import Daemon, kregctl_binary  # noqa: E402


def own_kregd(root: pathlib.Path, pipe_dir: str) -> Daemon:
  if kregctl_binary() is None:
    pytest.skip("kregctl not built")
  env = dict(os.environ)
  env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
  d = Daemon(root, [], env=env)
  d.start(timeout=60)
  return d


def test_gpu_without_mps_is_time_sliced_and_warned(gpu):
  if os.environ.get("KREG_EXPECT_GPU_SHARING") == "mps":
    pytest.skip("the mps pass: a second, non-MPS kregd is not wanted here")
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-gs-", dir="/tmp"))
  try:
    pipe = root / "pipe"
    pipe.mkdir()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(pipe / "control"))
    s.listen(1)
    s.close()  # stale: the file stays, nothing listens
    d = own_kregd(root, str(pipe))
    try:
      js = d.status()
      assert js["gpu_sharing"] == "time-sliced", js
      assert f"{pipe}/control is stale" in js["gpu_sharing_note"], js
      log = d.log()
      assert "GPU sharing: time-sliced" in log, log
      assert "nvidia-mps.service" in log, log
    finally:
      d.stop()
  finally:
    shutil.rmtree(root, ignore_errors=True)


def test_kregd_under_mps_reports_mps(gpu, kregd_socket):
  """The kregd of run.sh's mps pass runs under its MPS control daemon."""
  if os.environ.get("KREG_EXPECT_GPU_SHARING") != "mps":
    pytest.skip("not the mps pass of tests/gpu/run.sh")
  kregctl = kregctl_binary()
  if kregctl is None:
    pytest.skip("kregctl not built")
  import json  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  r = subprocess.run([str(kregctl), "--socket", kregd_socket, "status",
                      "--json"], capture_output=True, text=True, timeout=30)
  assert r.returncode == 0, r.stderr
  js = json.loads(r.stdout)
  pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
  assert js["gpu_sharing"] == "mps", js
  assert js["gpu_sharing_note"] == f"MPS control daemon at {pipe}/control"
