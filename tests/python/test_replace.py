"""replace = "owner" (docs/replace.md), through the real kregd and kregctl:
the owner (or root) makes the next generation with --replace, kregctl show
lists the generations, a restart keeps the last one and a process that binds
the name afterwards runs its module; another uid is refused naming the
owner; while a live process has the target bound the replacement is refused
naming it (re-pointing running processes is not built yet)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

import kernels_util as ku
import kregd_proc
from kregd_proc import run_kregctl as kregctl


@pytest.fixture
def d():
  daemon = kregd_proc.start_test_daemon("kreg-replace-",
                                        ["--replace", "owner"])
  yield daemon
  kregd_proc.finish_test_daemon(daemon)


def register(d, name, module, *extra, check=True):
  return kregctl(d, "register", name, "--module",
                 str(ku.kernel_path(module)), "--function", "Scale",
                 "--platform", "cpu", *extra, check=check)


def show(d, name):
  [target] = json.loads(kregctl(d, "show", name, "--json").stdout)
  return target


# Binds argv[1] in this process (argv[2]: local or isolated), calls it once,
# prints its result and whether the v2 build is mapped here, then waits for
# stdin to close.
BIND_AND_WAIT = """
import json, sys
import jax, numpy as np
import kreg
name, mode = sys.argv[1], sys.argv[2]
kreg.bind_ffi_target(name, platform="cpu", execution=mode)
x = np.arange(4, dtype=np.float32)
y = np.asarray(jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(x.shape, x.dtype))(
    x, factor=np.float32(2))).tolist()
v2 = False
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb") as mem:
  for line in maps:
    fields = line.split()
    if "kreg-module-" in line and "r" in fields[1]:
      lo, hi = (int(v, 16) for v in fields[0].split("-"))
      mem.seek(lo)
      v2 = v2 or b"kreg demo kernels v2" in mem.read(hi - lo)
print(json.dumps({"y": y, "v2": v2}), flush=True)
sys.stdin.read()
"""


def bind(d, name, mode):
  """A child process that bound `name` and called it; its first line."""
  p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(BIND_AND_WAIT),
                        name, mode], env=d.env(), stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
  line = p.stdout.readline()
  if not line:
    p.kill()
    raise AssertionError(p.stderr.read())
  return p, json.loads(line)


def end(p):
  p.stdin.close()
  assert p.wait(timeout=60) == 0, p.stderr.read()


def test_the_owner_replaces_and_a_restart_keeps_the_generation(d):
  register(d, "demo.repl", "libdemo.so")
  v1 = show(d, "demo.repl")
  assert v1["generation"] == 1 and v1["generations"] == []

  # Without --replace the refusal says how to replace.
  refused = register(d, "demo.repl", "libdemo_v2.so", check=False)
  assert refused.returncode == 3, refused.stderr
  assert "register with replace=True to make the next generation" in (
      refused.stderr)

  register(d, "demo.repl", "libdemo_v2.so", "--replace")
  v2 = show(d, "demo.repl")
  assert v2["generation"] == 2
  assert [g["generation"] for g in v2["generations"]] == [1, 2]
  assert [g["module_digest"] for g in v2["generations"]] == [
      v1["module_digest"], v2["module_digest"]]
  assert v2["module_digest"] != v1["module_digest"]
  assert v2["uid"] == os.geteuid()  # the owner's first registration
  text = kregctl(d, "show", "demo.repl").stdout
  assert "generation: 2\n" in text
  assert f"  generation 1: content {v1['content_id']}, function \"Scale\"" in (
      text)
  # The same content with --replace again is a no-op.
  assert "already registered" in register(d, "demo.repl", "libdemo_v2.so",
                                          "--replace").stdout

  d.restart()
  assert show(d, "demo.repl")["generation"] == 2
  for mode in ("local", "isolated"):
    p, out = bind(d, "demo.repl", mode)
    end(p)
    assert out["y"] == [0.0, 2.0, 4.0, 6.0]
    if mode == "local":
      assert out["v2"], "the local bind did not load generation 2's module"


def test_a_live_process_holding_the_target_blocks_the_replacement(d):
  register(d, "demo.held", "libdemo.so")
  p, _ = bind(d, "demo.held", "isolated")
  try:
    refused = register(d, "demo.held", "libdemo_v2.so", "--replace",
                       check=False)
  finally:
    end(p)
  assert refused.returncode == 3, refused.stderr
  assert (f'cannot replace target "demo.held" (cpu) yet: live sessions have '
          f"it bound (pid {p.pid} of ") in refused.stderr
  assert "re-pointing running processes is not built yet" in refused.stderr
  assert show(d, "demo.held")["generation"] == 1


@pytest.fixture
def shared_files(d):
  """kregctl and libdemo_v2.so where throwaway uids can run and read them."""
  if os.geteuid() != 0:
    pytest.skip("needs root: registrations run as uids 65534 and 65533")
  os.chmod(d.root, 0o711)
  work = pathlib.Path(tempfile.mkdtemp(prefix="kreg-replace-", dir="/var/tmp"))
  os.chmod(work, 0o755)
  shutil.copy(kregd_proc.kregctl_binary(), work / "kregctl")
  for m in ("libdemo.so", "libdemo_v2.so"):
    shutil.copy(ku.kernel_path(m), work / m)
  for f in work.iterdir():
    os.chmod(f, 0o755)
  yield work
  shutil.rmtree(work, ignore_errors=True)


def test_another_uid_is_refused_naming_the_owner_and_root_may(d,
                                                              shared_files):
  def as_uid(uid, module, *extra):
    return subprocess.run(
        [str(shared_files / "kregctl"), "--socket", d.socket, "register",
         "demo.owned", "--module", str(shared_files / module), "--function",
         "Scale", "--platform", "cpu", *extra],
        capture_output=True, text=True, timeout=60, user=uid, group=0,
        extra_groups=[], cwd="/")

  assert as_uid(65534, "libdemo.so").returncode == 0
  other = as_uid(65533, "libdemo_v2.so", "--replace")
  assert other.returncode != 0
  assert ('cannot replace target "demo.owned" (cpu): it is owned by uid 65534'
          in other.stderr), other.stderr
  assert "(you are uid 65533)" in other.stderr
  assert show(d, "demo.owned")["generation"] == 1
  kregctl(d, "register", "demo.owned", "--module",
          str(shared_files / "libdemo_v2.so"), "--function", "Scale",
          "--platform", "cpu", "--replace")
  owned = show(d, "demo.owned")
  assert owned["generation"] == 2 and owned["uid"] == 65534
  assert owned["generations"][1]["uid"] == 0
