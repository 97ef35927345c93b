"""Trust follows content (DESIGN §14 rule 1, docs/replace.md "Who switches"),
through the real kregd under replace = "owner", kregctl and JAX, with real
uids: uid A (65534) registers the name that B's library uses, with the
library's own bytes (libdemo.so); B (uid 65533) registers it too, a no-op,
and holds A's target. When A replaces it (libdemo_v2.so, whose Scale scales
by factor + 1), B keeps computing generation 1's result, isolated and
local, and is no laggard; a process that binds the name and trusts A
switches, one that does not trust A is refused at its bind. B's own uid's
replacement, and root's, do switch B's process. With $KREG_TRUSTED_OWNERS
not naming A, B's registration of A's target is refused, naming A's uid and
what to do.

B's processes are JAX processes of uid 65533 (setpriv): this machine's
Python lives under /root (mode 0700), so they keep CAP_DAC_READ_SEARCH to
read it; kregd knows them by their uid (SO_PEERCRED) only."""

import json
import os
import pathlib
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

import kernels_util as ku
import kregd_proc
from holder import Holder
from kregd_proc import run_kregctl as kregctl

A, B = 65534, 65533
V1, V2 = [0.0, 2.0, 4.0, 6.0], [0.0, 3.0, 6.0, 9.0]


def start(*extra):
  if os.geteuid() != 0:
    pytest.skip("needs root: processes run as uids 65534 and 65533")
  daemon = kregd_proc.start_test_daemon("kreg-trust-",
                                        ["--replace", "owner", *extra])
  os.chmod(daemon.root, 0o711)
  work = pathlib.Path(tempfile.mkdtemp(prefix="kreg-trust-", dir="/var/tmp"))
  os.chmod(work, 0o755)
  shutil.copy(kregd_proc.kregctl_binary(), work / "kregctl")
  for m in ("libdemo.so", "libdemo_v2.so"):
    shutil.copy(ku.kernel_path(m), work / m)
  for f in work.iterdir():
    os.chmod(f, 0o755)
  daemon.work = work
  yield daemon
  kregd_proc.finish_test_daemon(daemon)
  shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def d():
  yield from start()


@pytest.fixture
def d_shared():
  """One executor for every process: B's and the follower's sessions."""
  yield from start("--isolation", "shared")


def as_uid(uid):
  """setpriv's prefix: run as `uid`, group 0 (the socket's), no other
  groups, reading what root may (see the module's comment)."""
  return ["setpriv", f"--reuid={uid}", "--regid=0", "--clear-groups",
          "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
          "--"]


def register_as(d, uid, name, module, *extra):
  return subprocess.run(
      [*as_uid(uid), str(d.work / "kregctl"), "--socket", d.socket,
       "register", name, "--module", str(d.work / module), "--function",
       "Scale", "--platform", "cpu", *extra],
      capture_output=True, text=True, timeout=120, cwd="/")


# Registers argv[1] with libdemo.so (argv[2]: local or isolated; argv[4]
# "intercept": as a plain JAX library does, jax.ffi.register_ffi_target of
# the loaded library's handler, under kreg.intercept(); "bind": binds it by
# name instead, kreg.bind_ffi_target), then calls it once
# per line on stdin: {"y": result}. The first line says what the
# registration did (or why it was refused).
REGISTER_AND_CALL = """
import ctypes, json, sys
import jax, numpy as np
import kreg
name, mode, module, how = sys.argv[1:5]
try:
  if how == "bind":  # no registration: follow the name's owner
    r = kreg.bind_ffi_target(name, platform="cpu", execution=mode)
  elif how == "intercept":
    kreg.configure(execution=mode)
    with kreg.intercept():
      jax.ffi.register_ffi_target(
          name, jax.ffi.pycapsule(ctypes.CDLL(module).Scale), platform="cpu")
    [t] = [t for t in kreg.list_registered_targets() if t.target_name == name]
    r = kreg.Registration(False, t)
  else:
    r = kreg.register_ffi_target(name, module, "Scale", platform="cpu",
                                 execution=mode)
except kreg.UntrustedTargetError as e:
  print(json.dumps({"refused": str(e), "uid": e.uid,
                    "permission": isinstance(e, PermissionError),
                    "bound": kreg.connect().bound_mode(name, "cpu")}),
        flush=True)
  sys.exit(0)
print(json.dumps({"created": r.created, "owner": r.target.uid}), flush=True)
f = jax.jit(lambda x: jax.ffi.ffi_call(
    name, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=np.float32(2)))
x = np.arange(4, dtype=np.float32)
for line in sys.stdin:
  print(json.dumps({"y": np.asarray(f(x)).tolist()}), flush=True)
"""


class Registrant:
  """A JAX process of `uid` that registered `name` with libdemo.so."""

  def __init__(self, d, uid, name, mode, env=None, how="kreg"):
    self.p = subprocess.Popen(
        [*as_uid(uid), sys.executable, "-c", textwrap.dedent(REGISTER_AND_CALL),
         name, mode, str(d.work / "libdemo.so"), how],
        env={**d.env(), "HOME": "/", **(env or {})}, cwd="/",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    self.first = self._line()

  def _line(self):
    line = self.p.stdout.readline()
    if not line:
      self.p.kill()
      raise AssertionError(self.p.stderr.read())
    return json.loads(line)

  def call(self):
    self.p.stdin.write("call\n")
    self.p.stdin.flush()
    return self._line()["y"]

  def end(self):
    self.p.stdin.close()
    assert self.p.wait(timeout=60) == 0, self.p.stderr.read()


def show(d, name):
  [target] = json.loads(kregctl(d, "show", name, "--json").stdout)
  return target


def generation_of(d, name, pid):
  for b in show(d, name)["bound_by"]:
    if b["pid"] == pid:
      return b["generation"]
  raise AssertionError(f"pid {pid} does not hold {name}: {show(d, name)}")


@pytest.mark.parametrize("mode,how", [("isolated", "kreg"),
                                      ("local", "kreg"),
                                      ("isolated", "intercept")])
def test_a_squatted_name_replaced_by_its_squatter_never_reaches_the_victim(
    d, mode, how):
  name = f"trust.{mode}.{how}"
  squat = register_as(d, A, name, "libdemo.so")
  assert squat.returncode == 0, squat.stderr
  b = Registrant(d, B, name, mode, how=how)
  follower = Holder(d, name, mode)  # root, binding by name: trusts anyone
  try:
    assert b.first == {"created": False, "owner": A}
    assert b.call() == V1
    assert follower.call()["y"] == V1
    r = register_as(d, A, name, "libdemo_v2.so", "--replace")
    # B is no laggard: it was never meant to switch.
    assert r.returncode == 0, r.stderr
    assert show(d, name)["generation"] == 2
    assert b.call() == V1, "B's process runs the squatter's replacement"
    assert follower.call()["y"] == V2
    assert generation_of(d, name, b.p.pid) == 1
    assert generation_of(d, name, follower.pid) == 2
    # A second replacement by A does not reach it either.
    r = register_as(d, A, name, "libdemo.so", "--replace")
    assert r.returncode == 0, r.stderr
    assert b.call() == V1 and follower.call()["y"] == V1
  finally:
    b.end()
    follower.end()


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_a_bind_by_name_follows_only_a_trusted_owner(d, mode):
  name = f"trust.bind.{mode}"
  assert register_as(d, A, name, "libdemo.so").returncode == 0
  nobody = pwd.getpwuid(A).pw_name
  # B's process that trusts A follows A's replacement.
  trusting = Registrant(d, B, name, mode, how="bind",
                        env={"KREG_TRUSTED_OWNERS": nobody})
  # One that does not trust A is refused at its bind, as before: it never
  # holds A's target, so no replacement can reach it.
  wary = Registrant(d, B, name, mode, how="bind",
                    env={"KREG_TRUSTED_OWNERS": str(B)})
  wary.end()
  try:
    assert trusting.first == {"created": False, "owner": A}
    assert trusting.call() == V1
    assert wary.first["uid"] == A and wary.first["bound"] is None
    assert (f'target "{name}" (cpu) was registered by uid {A} ({nobody}), '
            f"who is not among the owners this process trusts ({B})"
            in wary.first["refused"]), wary.first
    r = register_as(d, A, name, "libdemo_v2.so", "--replace")
    assert r.returncode == 0, r.stderr
    assert trusting.call() == V2
    assert generation_of(d, name, trusting.p.pid) == 2
  finally:
    trusting.end()


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_the_process_s_own_uid_and_root_do_switch_it(d, mode):
  # B owns the name: its own replacement switches B's registering process.
  own = f"trust.own.{mode}"
  assert register_as(d, B, own, "libdemo.so").returncode == 0
  b = Registrant(d, B, own, mode)
  try:
    assert b.first == {"created": False, "owner": B}
    assert b.call() == V1
    r = register_as(d, B, own, "libdemo_v2.so", "--replace")
    assert r.returncode == 0, r.stderr
    assert b.call() == V2
  finally:
    b.end()
  # A owns it: root's replacement switches B's process too.
  rooted = f"trust.root.{mode}"
  assert register_as(d, A, rooted, "libdemo.so").returncode == 0
  b = Registrant(d, B, rooted, mode)
  try:
    assert b.first == {"created": False, "owner": A}
    assert b.call() == V1
    kregctl(d, "register", rooted, "--module", str(d.work / "libdemo_v2.so"),
            "--function", "Scale", "--platform", "cpu", "--replace")
    assert b.call() == V2
  finally:
    b.end()


def test_trusted_owners_refuse_a_registration_that_matched_another_uid(d):
  assert register_as(d, A, "trust.refused", "libdemo.so").returncode == 0
  nobody = pwd.getpwuid(A).pw_name
  for how in ("kreg", "intercept"):
    b = Registrant(d, B, "trust.refused", "isolated",
                   env={"KREG_TRUSTED_OWNERS": str(B)}, how=how)
    assert b.first["uid"] == A and b.first["permission"], b.first
    assert b.first["bound"] is None  # nothing forwards to A's module
    assert (f'target "trust.refused" (cpu) is already registered by uid {A} '
            f"({nobody}), who is not among the owners this process trusts "
            f"({B}): this registration matched that user's target"
            in b.first["refused"]), b.first
    assert "Register your build under a name of your own" in b.first["refused"]
    assert "KREG_TRUSTED_OWNERS" in b.first["refused"]
    b.end()
  # Trusting A, the same registration goes through.
  ok = Registrant(d, B, "trust.refused", "isolated",
                  env={"KREG_TRUSTED_OWNERS": f"{B},{nobody}"})
  try:
    assert ok.first == {"created": False, "owner": A}
    assert ok.call() == V1
  finally:
    ok.end()


def test_in_a_shared_executor_only_the_follower_switches(d_shared):
  d = d_shared
  assert register_as(d, A, "trust.shared", "libdemo.so").returncode == 0
  b = Registrant(d, B, "trust.shared", "isolated")
  follower = Holder(d, "trust.shared")
  try:
    assert b.call() == V1 and follower.call()["y"] == V1
    # Both sessions run in the one executor that the re-point reaches.
    assert len({e["pid"] for e in d.status()["executors"]}) == 1, d.status()
    r = register_as(d, A, "trust.shared", "libdemo_v2.so", "--replace")
    assert r.returncode == 0, r.stderr
    assert follower.call()["y"] == V2
    assert b.call() == V1
  finally:
    b.end()
    follower.end()
