"""The launch ring's knobs as configuration (DESIGN §9): `launch_ring` and
`ring_spin_us` (TOML keys, `--launch-ring` / `--ring-spin-us` flags, and the
older $KREGD_LAUNCH_RING / $KREGD_RING_SPIN_US below both). Bad values stop
kregd with exit 2 and a message naming the source and the value; good ones
reach the executors: with the ring off a client maps no ring, and the spin
shows in the executor's CPU time. Real kregd, executors and JAX clients."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import kernels_util as ku
from kregd_proc import Daemon, daemon_binary, kregctl_binary

CLIENT = """
import sys
import jax, numpy as np, kreg
kreg.register_ffi_target("ring.scale", sys.argv[1], "Scale", platform="cpu")
f = jax.jit(lambda v: jax.ffi.ffi_call("ring.scale",
    jax.ShapeDtypeStruct(v.shape, v.dtype))(v, factor=np.float32(2)))
x = np.arange(16, dtype=np.float32)
assert np.array_equal(np.asarray(f(x)), 2 * x)
maps = open("/proc/self/maps").read()
print("RING", "memfd:kreg-ring" in maps, flush=True)
for line in sys.stdin:  # one call per line, until stdin closes
  assert np.array_equal(np.asarray(f(x)), 2 * x)
  print("CALLED", flush=True)
"""


@pytest.fixture
def root():
  d = pathlib.Path(tempfile.mkdtemp(prefix="kreg-ring-", dir="/tmp"))
  yield d
  shutil.rmtree(d, ignore_errors=True)


def need_kregd():
  if not daemon_binary().is_file():
    pytest.skip(f"{daemon_binary()} not built")


def kregd_env(**extra) -> dict:
  env = {k: v for k, v in os.environ.items()
         if k not in ("KREGD_LAUNCH_RING", "KREGD_RING_SPIN_US")}
  env.update(extra)
  return env


def refused(root, args, env=None, toml=None):
  """Runs kregd expecting it to refuse its configuration."""
  need_kregd()
  cmd = [str(daemon_binary()), "--socket", str(root / "k.sock"),
         "--state-dir", str(root / "state"), *args]
  if toml is not None:
    (root / "k.toml").write_text(toml)
    cmd += ["--config", str(root / "k.toml")]
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                     env=env or kregd_env())
  assert r.returncode == 2, (r.returncode, r.stderr)
  assert not (root / "k.sock").exists()
  return r.stderr


@pytest.mark.parametrize("args, message", [
    (["--launch-ring", "maybe"],
     '--launch-ring is "maybe"; use on or off'),
    (["--ring-spin-us", "-5"],
     '--ring-spin-us is "-5"; use a whole number of microseconds from 0'),
    (["--ring-spin-us", "2000000"],
     '--ring-spin-us is "2000000"; use a whole number of microseconds from '
     '0 (sleep at once) to 1000000'),
    (["--ring-spin-us", "50us"],
     '--ring-spin-us is "50us"; use a whole number'),
])
def test_bad_flags_are_refused(root, args, message):
  assert message in refused(root, args)


@pytest.mark.parametrize("toml, message", [
    ('launch_ring = "yes"\n', 'key "launch_ring" must be true or false'),
    ("ring_spin_us = -1\n",
     'key "ring_spin_us" must be a whole number of microseconds from 0 to '
     "1000000, not -1"),
    ("ring_spin_us = 1.5\n",
     'key "ring_spin_us" must be a whole number of microseconds from 0 to '
     "1000000, not a number"),
])
def test_bad_config_keys_are_refused(root, toml, message):
  assert message in refused(root, [], toml=toml)


@pytest.mark.parametrize("name, value, message", [
    ("KREGD_LAUNCH_RING", "maybe", '$KREGD_LAUNCH_RING is "maybe"; use on'),
    ("KREGD_RING_SPIN_US", "fast", '$KREGD_RING_SPIN_US is "fast"; use a '
     "whole number"),
])
def test_bad_environment_values_are_refused(root, name, value, message):
  assert message in refused(root, [], env=kregd_env(**{name: value}))


class Client:
  """A JAX process calling Scale through `d`, one call per poke()."""

  def __init__(self, d: Daemon):
    self.proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CLIENT),
         str(ku.kernel_path(ku.DEMO))], env=d.env(), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = self.proc.stdout.readline()
    assert line.startswith("RING "), line + self.proc.stderr.read()[-3000:]
    self.ring = line.split()[1] == "True"

  def poke(self):
    self.proc.stdin.write("call\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    assert line.strip() == "CALLED", line + self.proc.stderr.read()[-3000:]

  def close(self):
    self.proc.stdin.close()
    assert self.proc.wait(timeout=60) == 0, self.proc.stderr.read()[-3000:]


def run_daemon(root, args=(), env=None, toml=None) -> Daemon:
  if kregctl_binary() is None:
    pytest.skip("kregctl not built")
  extra = list(args)
  if toml is not None:
    (root / "k.toml").write_text(toml)
    extra += ["--config", str(root / "k.toml")]
  d = Daemon(root, [os.path.realpath(ku.kernels_dir())], extra,
             env=env or kregd_env())
  try:
    d.start()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  return d


@pytest.mark.parametrize("how", ["default", "flag", "toml", "env",
                                 "flag-over-toml", "toml-over-env"])
def test_launch_ring_on_or_off_reaches_the_clients(root, how):
  args, env, toml, want = [], None, None, True
  if how == "flag":
    args, want = ["--launch-ring", "off"], False
  elif how == "toml":
    toml, want = "launch_ring = false\n", False
  elif how == "env":
    env, want = kregd_env(KREGD_LAUNCH_RING="0"), False
  elif how == "flag-over-toml":
    args, toml, want = ["--launch-ring", "on"], "launch_ring = false\n", True
  elif how == "toml-over-env":
    env, toml, want = kregd_env(KREGD_LAUNCH_RING="off"), \
        "launch_ring = true\n", True
  d = run_daemon(root, args, env, toml)
  try:
    c = Client(d)
    try:
      c.poke()  # calls work either way
      assert c.ring is want, d.log()
    finally:
      c.close()
  finally:
    d.stop()


def cpu_seconds(pid: int) -> float:
  fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]
  utime, stime = fields.split()[11:13]
  return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("spin_us", [0, 1000000])
def test_ring_spin_us_reaches_the_executor(root, spin_us):
  """After a ring launch the executor's ring thread spins ring_spin_us
  before it sleeps: 1 s of spinning after each launch shows as CPU time of
  the executor, 0 as (almost) none. Generous bounds: this is not a speed test."""
  # One executor per uid, so the one listed serves the client. Spins adapt
  # to the waits they see (ring::SpinPolicy): not here, where the
  # configured spin itself is measured.
  d = run_daemon(root, ["--ring-spin-us", str(spin_us), "--isolation", "uid"],
                 env=dict(kregd_env(), KREG_RING_ADAPTIVE="0"))
  try:
    c = Client(d)
    try:
      assert c.ring, d.log()
      execs = d.status()["executors"]
      assert len(execs) == 1, execs
      pid = execs[0]["pid"]
      time.sleep(1.2)  # the first call's spin, if any, is over
      before = cpu_seconds(pid)
      # Three launches 0.8 s apart: with a 1 s spin the executor spins all
      # 2.4 s, so even a thread that shares its core with two others (a
      # loaded 2-core machine) spends 0.8 s of CPU.
      for _ in range(3):
        c.poke()
        time.sleep(0.8)
      spent = cpu_seconds(pid) - before
    finally:
      c.close()
    if spin_us == 0:
      assert spent < 0.15, spent
    else:
      assert spent > 0.4, spent
  finally:
    d.stop()
