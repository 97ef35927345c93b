"""What a client repeats must not grow kregd's disk or memory (DESIGN §6,
hostile clients). Registering fresh modules and retiring them leaves no
store files behind: a module leaves the store once the last target that
references it is retired, and a kregd that starts removes store files no
journaled target references (a crash between a retirement's record and the
file's removal). Binding one target locally again and again on a session
makes no new memfd, hashes nothing again and logs one line; every session
that binds a module gets the same sealed memfd, and the memfds kregd keeps
are bounded by max_local_module_memory_bytes.

The sessions are spoken by hand (test_session_upload_limits.CLIENT), so
repeating a BindLocal is not up to the shim."""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

import kernels_util as ku
import kreg
from kregd_proc import finish_test_daemon, kregctl_binary, start_test_daemon
from test_session_upload_limits import NOBODY, run_client

MiB = 1 << 20


def fresh_module(path, pad):
  """libdemo.so with `pad` random bytes appended: a loadable module whose
  digest no other has. Returns its bytes."""
  data = ku.kernel_path(ku.DEMO).read_bytes() + os.urandom(pad)
  path.write_bytes(data)
  os.chmod(path, 0o644)
  return data


def digest(data):
  return "sha256:" + hashlib.sha256(data).hexdigest()


def store(d):
  """{digest: size} of the files in `d`'s module store."""
  out = {}
  for f in pathlib.Path(d.state_dir, "modules").iterdir():
    if f.name.startswith("sha256-") and f.name.endswith(".so"):
      out["sha256:" + f.name[7:-3]] = f.stat().st_size
  return out


def test_register_retire_churn_leaves_no_store_files():
  kregctl = kregctl_binary()
  if kregctl is None:
    pytest.skip("kregctl not built")
  module_bytes = 2 * MiB
  # Room for two modules: the churn stays within it only if what is
  # retired stops counting and leaves the store.
  quota = 5 * MiB
  d = start_test_daemon("kreg-churn-",
                        ["--max-store-bytes-per-uid", str(quota)])
  try:
    # As uid 65534 when we are root: quotas do not apply to root.
    who = {}
    if os.geteuid() == 0:
      os.chmod(d.root, 0o711)
      who = {"user": NOBODY, "group": 0, "extra_groups": []}
      exe = d.root / "kregctl"
      shutil.copy(kregctl, exe)
      os.chmod(exe, 0o755)
      kregctl = exe

    def ctl(*args):
      p = subprocess.run([str(kregctl), "--socket", d.socket, *args],
                         capture_output=True, text=True, timeout=60, **who)
      assert p.returncode == 0, p.stdout + p.stderr + d.log()
      return p.stdout

    keep = fresh_module(d.root / "keep.so", module_bytes)
    ctl("register", "churn.keep", "--module", str(d.root / "keep.so"),
        "--function", "Scale")
    for i in range(10):
      module = d.root / f"fresh{i}.so"
      data = fresh_module(module, module_bytes)
      ctl("register", "churn.fresh", "--module", str(module), "--function",
          "Scale")
      assert digest(data) in store(d)
      ctl("retire", "churn.fresh")
      # Journaled, then removed: only what a target references is left.
      assert store(d) == {digest(keep): len(keep)}, d.log()
      module.unlink()
    assert "removed 1 files (" in d.log(tail=None)

    # A file no journaled target references, as a crash between a
    # retirement's record and the file's removal leaves one: removed when
    # kregd starts. What targets reference stays and runs.
    d.stop()
    left = b"\x7fELF left behind by a crash"
    modules = pathlib.Path(d.state_dir, "modules")
    (modules / f"sha256-{hashlib.sha256(left).hexdigest()}.so").write_bytes(
        left)
    d.start()
    assert store(d) == {digest(keep): len(keep)}, d.log()
    assert ("removed 1 unreferenced store files (" f"{len(left)} bytes)"
            in d.log())
    listed = json.loads(ctl("list", "--json"))
    assert [t["target_name"] for t in listed] == ["churn.keep"]
  finally:
    finish_test_daemon(d)


def module_target(d, name, pad):
  """Registers `name` (cpu, Scale) with a fresh module of libdemo.so plus
  `pad` bytes; returns the module's bytes."""
  data = fresh_module(d.root / f"{name}.so", pad)
  kreg.Client(d.socket).register_ffi_target(name, data, "Scale",
                                            platform="cpu")
  return data


def module_memfds(pid):
  """The module memfds (ModuleStore::SealedCopy's) process `pid` has open."""
  out = []
  for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
      link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
      continue  # closed meanwhile
    if link.startswith("/memfd:kreg-module-"):
      out.append(link)
  return out


def test_repeated_local_binds_share_one_memfd_and_log_once():
  d = start_test_daemon("kreg-binds-")
  try:
    data = module_target(d, "bind.twenty", 4 * MiB)
    out = run_client(d, [{"kind": "bind", "name": "bind.twenty"}] * 20 +
                     [{"kind": "bind", "name": "bind.twenty", "session": 1}],
                     user=None)
    hello, *binds, hello2, other = out
    assert hello["code"] == 0 and hello2["code"] == 0, out
    inodes = set()
    for b in binds + [other]:
      assert b["code"] == 0 and b["body"] == 11, b  # BindLocalReply
      [(inode, size)] = b["fds"]
      assert size == len(data)
      inodes.add(inode)
    # One memfd for all 21 binds of both sessions: copied and hashed once.
    assert len(inodes) == 1, inodes
    # One line per session that holds it, not one per request.
    lines = [l for l in d.log(tail=None).splitlines()
             if '"bind.twenty" (cpu) bound locally' in l]
    assert len(lines) == 2, lines
    # kregd keeps that one memfd open, not one per bind.
    assert len(module_memfds(d.pid)) == 1, module_memfds(d.pid)
  finally:
    finish_test_daemon(d)


def test_local_module_memory_is_bounded_by_its_key(tmp_path):
  config = tmp_path / "kregd.toml"
  limit = 3 * MiB
  config.write_text(f"max_local_module_memory_bytes = {limit}\n")
  d = start_test_daemon("kreg-bindmem-", ["--config", str(config)])
  try:
    a = module_target(d, "bind.a", 2 * MiB)
    b = module_target(d, "bind.b", 2 * MiB)
    # Session 0 holds a's memfd: b's does not fit beside it.
    out = run_client(d, [{"kind": "bind", "name": "bind.a"},
                         {"kind": "bind", "name": "bind.b", "session": 1}],
                     user=None)
    _, held, _, refused = out
    assert held["code"] == 0 and held["fds"][0][1] == len(a), held
    assert refused["code"] == 8 and not refused["fds"], refused
    assert refused["message"] == (
        f'target "bind.b" (cpu): its module of {len(b)} bytes does not fit '
        "in the memory kregd keeps for modules handed out for local "
        f"execution: live sessions hold {len(a)} of its {limit} bytes "
        "(max_local_module_memory_bytes); run the target isolated, bind it "
        "again once other sessions have ended, or ask the operator to raise "
        "max_local_module_memory_bytes"), refused
    # Once that session has ended, a's memfd makes room for b's.
    deadline = time.monotonic() + 30
    while True:
      _, again = run_client(d, [{"kind": "bind", "name": "bind.b"}],
                            user=None)
      if again["code"] == 0 or time.monotonic() > deadline:
        break
      time.sleep(0.2)
    assert again["code"] == 0 and again["fds"][0][1] == len(b), again
  finally:
    finish_test_daemon(d)


O_CLOEXEC = 0o2000000


def test_every_descriptor_of_kregd_is_close_on_exec():
  # kregd-probe, kregd-exec and kregd-compile must not inherit kregd's
  # sockets: a probe still running when kregd was killed kept the gRPC
  # socket accepting, and the next kregd refused to start ("another daemon
  # is already serving"). Once kregd serves (a registration probed, a
  # session and its executor up), every descriptor it holds past stderr is
  # close-on-exec.
  try:
    ku.kernel_path(ku.DEMO)
  except FileNotFoundError as e:
    pytest.skip(str(e))
  d = start_test_daemon("kreg-cloexec-")
  try:
    client = (
        "import jax, numpy as np, kreg, kernels_util as ku\n"
        "kreg.register_ffi_target('cloexec.scale', ku.kernel_path(ku.DEMO),"
        " 'Scale', platform='cpu')\n"
        "x = np.arange(8, dtype=np.float32)\n"
        "y = jax.ffi.ffi_call('cloexec.scale', jax.ShapeDtypeStruct(x.shape,"
        " x.dtype))(x, factor=np.float32(2))\n"
        "assert np.array_equal(np.asarray(y), x * 2)\n"
        "print('called', flush=True)\n")
    r = subprocess.run([sys.executable, "-c", client], env=d.env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "called" in r.stdout, r.stderr + d.log()
    inheritable = []
    fd_dir = pathlib.Path(f"/proc/{d.proc.pid}/fd")
    for entry in fd_dir.iterdir():
      fd = int(entry.name)
      if fd <= 2:
        continue
      try:
        info = pathlib.Path(f"/proc/{d.proc.pid}/fdinfo/{fd}").read_text()
        target = os.readlink(entry)
      except FileNotFoundError:
        continue  # closed meanwhile
      flags = int(info.split("flags:")[1].split()[0], 8)
      if not flags & O_CLOEXEC:
        inheritable.append((fd, target))
    assert inheritable == [], inheritable
  finally:
    finish_test_daemon(d)
