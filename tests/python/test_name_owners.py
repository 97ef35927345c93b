"""Names have owners. Name reservations (docs/operator-guide.md, "Name
reservations"): kregctl reserve as root, registrations by the owner, by
another uid (refused, the message naming the owner) and by root, through the
real kregd and kregctl, as throwaway uids; the reservation survives a
restart and can be lifted. Trusted owners (docs/user-guide.md, "Trusting a
target's owner"): bind_ffi_target(owners=...) and $KREG_TRUSTED_OWNERS
refuse a target registered by anyone else."""

import grp
import json
import os
import pathlib
import pwd
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

import kernels_util as ku
import kregd_proc


@pytest.fixture
def d():
  if os.geteuid() != 0:
    pytest.skip("needs root: registrations run as uids 65534 and 65533")
  daemon = kregd_proc.start_test_daemon("kreg-reserve-")
  os.chmod(daemon.root, 0o711)
  work = pathlib.Path(tempfile.mkdtemp(prefix="kreg-reserve-", dir="/var/tmp"))
  os.chmod(work, 0o755)
  for name in ("kregctl", "module.so"):
    src = (kregd_proc.kregctl_binary() if name == "kregctl" else
           pathlib.Path(ku.kernels_dir()) / "libdemo.so")
    shutil.copy(src, work / name)
    os.chmod(work / name, 0o755)
  daemon.work = work
  yield daemon
  kregd_proc.finish_test_daemon(daemon)
  shutil.rmtree(work, ignore_errors=True)


def register_as(d, uid: int, name: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [str(d.work / "kregctl"), "--socket", d.socket, "register", name,
       "--module", str(d.work / "module.so"), "--function", "Scale"],
      capture_output=True, text=True, timeout=60, user=uid, group=0,
      extra_groups=[], cwd="/")


def test_a_reserved_prefix_is_registered_by_its_owner_only(d):
  kregd_proc.run_kregctl(d, "reserve", "resv.*", "--owner", "65534")
  listed = json.loads(kregd_proc.run_kregctl(d, "reserve", "--json").stdout)
  assert [(r["pattern"], r["reserved_by_uid"]) for r in listed] == [
      ("resv.*", 0)]
  assert listed[0]["owner"].startswith("uid 65534")

  owner = register_as(d, 65534, "resv.op")
  assert owner.returncode == 0, owner.stdout + owner.stderr
  other = register_as(d, 65533, "resv.other")
  assert other.returncode != 0
  assert ('names matching "resv.*" are reserved for uid 65534' in
          other.stderr), other.stderr
  assert "uid 65533 is not that uid" in other.stderr
  # The command the refusal names exists and lists the reservation.
  named = re.search(r"`kregctl ([a-z]+)`, with no pattern, lists them",
                    other.stderr)
  assert named, other.stderr
  listing = kregd_proc.run_kregctl(d, named.group(1))
  assert listing.stdout.startswith("resv.*\tuid 65534"), listing.stdout
  assert register_as(d, 65533, "free.op").returncode == 0
  kregd_proc.run_kregctl(d, "register", "resv.root", "--module",
                         str(d.work / "module.so"), "--function", "Scale")

  # Journaled: still in force after a restart, until lifted.
  d.restart()
  assert "reserved for uid 65534" in register_as(d, 65533,
                                                 "resv.other").stderr
  kregd_proc.run_kregctl(d, "reserve", "resv.*", "--lift")
  assert json.loads(kregd_proc.run_kregctl(d, "reserve",
                                           "--json").stdout) == []
  assert kregd_proc.run_kregctl(d, "reserve").stdout == (
      "no target names are reserved on this host\n")
  assert register_as(d, 65533, "resv.other").returncode == 0


def test_reserve_errors_say_what_to_do(d):
  no_owner = kregd_proc.run_kregctl(d, "reserve", "resv.*", check=False)
  assert no_owner.returncode != 0
  assert "needs --owner" in no_owner.stderr
  bad = kregd_proc.run_kregctl(d, "reserve", "resv.*", "--owner",
                               "no-such-user-kreg", check=False)
  assert 'reservation owner "no-such-user-kreg" is no user on this host' in (
      bad.stderr)
  assert register_as(d, 65533, "taken.op").returncode == 0
  over = kregd_proc.run_kregctl(d, "reserve", "taken.*", "--owner", "65534",
                                check=False)
  assert 'target "taken.op" (cpu) by uid 65533' in over.stderr
  assert "kregctl retire" in over.stderr
  lift = kregd_proc.run_kregctl(d, "reserve", "nothing.*", "--lift",
                                check=False)
  assert 'no reservation of "nothing.*" to lift' in lift.stderr
  assert "`kregctl reserve`, with no pattern, lists them" in lift.stderr
  as_user = subprocess.run(
      [str(d.work / "kregctl"), "--socket", d.socket, "reserve", "mine.*",
       "--owner", "65533"], capture_output=True, text=True, timeout=60,
      user=65533, group=0, extra_groups=[], cwd="/")
  assert as_user.returncode != 0
  assert ("reserving target names is for root or kregd's own uid" in
          as_user.stderr), as_user.stderr


BIND_AS_ROOT = r"""
import os, sys, jax, jax.numpy as jnp, numpy as np, kreg
name, owners = sys.argv[1], sys.argv[2]
def call():
  x = jnp.arange(4, dtype=jnp.float32)
  y = jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(x.shape, x.dtype))(
      x, factor=np.float32(2.0))
  return np.asarray(y).tolist()
try:
  kreg.bind_ffi_target(name, platform="cpu",
                       owners=None if owners == "-" else owners.split(","))
except kreg.UntrustedTargetError as e:
  assert isinstance(e, PermissionError) and e.uid == 65534, e
  print("REFUSED", e)
  sys.exit(0)
print("CALLED", call())
"""


def bind_as_root(d, name, owners, env=None):
  p = subprocess.run([sys.executable, "-c", BIND_AS_ROOT, name, owners],
                     capture_output=True, text=True, timeout=120,
                     env={**d.env(), **(env or {})})
  assert p.returncode == 0, p.stdout + p.stderr
  return p.stdout


def test_bind_refuses_a_target_registered_outside_the_trusted_owners(d):
  owner = register_as(d, 65534, "owned.op")
  assert owner.returncode == 0, owner.stdout + owner.stderr
  nobody = pwd.getpwuid(65534).pw_name
  refused = bind_as_root(d, "owned.op", "daemon,group:daemon")
  assert ('target "owned.op" (cpu) was registered by uid 65534 '
          f"({nobody}), who is not among the owners this process trusts "
          "(daemon, group:daemon)") in refused, refused
  assert "kregctl reserve" in refused
  # The owner named by uid or by name, or no owners= at all: bound, called.
  assert "CALLED [0.0, 2.0, 4.0, 6.0]" in bind_as_root(d, "owned.op", "65534")
  assert "CALLED" in bind_as_root(d, "owned.op", nobody)
  assert "CALLED" in bind_as_root(d, "owned.op", "-")
  # The site default, from the environment.
  assert "REFUSED" in bind_as_root(d, "owned.op", "-",
                                   {"KREG_TRUSTED_OWNERS": "daemon"})
  assert "CALLED" in bind_as_root(d, "owned.op", "-",
                                  {"KREG_TRUSTED_OWNERS": f"daemon,{nobody}"})
  # A group of the registering process: its gid (0 here, the socket's
  # group) or a group of its user (nobody's primary group).
  assert "CALLED" in bind_as_root(d, "owned.op", "group:root")
  group = grp.getgrgid(pwd.getpwuid(65534).pw_gid).gr_name
  assert "CALLED" in bind_as_root(d, "owned.op", f"group:{group}")
  bad = subprocess.run(
      [sys.executable, "-c", "import kreg; kreg.bind_ffi_target('owned.op', "
       "platform='cpu', owners=['no-such-user-kreg'])"],
      capture_output=True, text=True, timeout=120, env=d.env())
  assert ("trusted owner 'no-such-user-kreg' is no user on this host" in
          bad.stderr), bad.stderr


EXPORT_AS_ROOT = r"""
import sys, jax, jax.numpy as jnp, numpy as np, kreg
name, owners = sys.argv[1], sys.argv[2].split(",")
f = jax.jit(lambda x: jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(x.shape,
    x.dtype))(x, factor=np.float32(2.0)))
exp = jax.export.export(f, disabled_checks=[
    jax.export.DisabledSafetyCheck.custom_call(name)])(
        jax.ShapeDtypeStruct((4,), jnp.float32))
try:
  kreg.bind_exported(exp, owners=owners)
except kreg.UntrustedTargetError as e:
  assert kreg.connect().bound_mode(name, "cpu") is None  # none bound
  print("REFUSED", e)
  sys.exit(0)
print("CALLED", np.asarray(exp.call(jnp.arange(4, dtype=jnp.float32))).tolist())
"""


def test_bind_exported_checks_the_owners_before_binding(d):
  owner = register_as(d, 65534, "owned.exp")
  assert owner.returncode == 0, owner.stdout + owner.stderr

  def run(owners):
    p = subprocess.run([sys.executable, "-c", EXPORT_AS_ROOT, "owned.exp",
                        owners], capture_output=True, text=True, timeout=120,
                       env=d.env())
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout

  refused = run("daemon")
  assert ('target "owned.exp" (cpu) was registered by uid 65534' in refused
          ), refused
  assert "CALLED [0.0, 2.0, 4.0, 6.0]" in run("65534")
