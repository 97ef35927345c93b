"""kregd under systemd (DESIGN §12): `systemctl restart kregd` while a
client calls in a loop fails no call.

systemd does not run on the test machine, so the test boots one: systemd
as PID 1 of a new PID and mount namespace, with a tmpfs /run holding the
shipped kregd.service and kregd.socket (daemon/systemd/) plus a drop-in
that points ExecStart= at the built kregd, and a target that starts only
them. The client runs inside the same namespaces (it must see the sockets
in that /run, and kregd must see its pid). Nothing else of the system is
started: every unit here has DefaultDependencies=no, and the units that
would touch the host (tmpfiles cleaning /tmp) are masked. Skipped, with
the reason, where that cannot be done (not root, no systemd, no
namespaces). Nothing of the host's kregd is used or touched: inside the
namespace a tmpfs covers /run and /etc/systemd/system (the host's units,
installed kregd units among them), and test directories cover /var/lib and
/var/cache (the units' StateDirectory= and CacheDirectory=)."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import kernels_util as ku
from kregd_proc import REPO_ROOT, daemon_binary

SYSTEMD = "/lib/systemd/systemd"

# Calls a forwarded CPU target in a loop and counts what failed; prints one
# JSON line when stdin says "stop".
CLIENT = textwrap.dedent("""
    import json, os, select, sys
    import jax, numpy as np
    import kreg, kernels_util as ku
    kreg.register_ffi_target("sd.Counter", ku.kernel_path("libhostile.so"),
                             "Counter", platform="cpu")
    x = np.zeros(4, np.float32)
    out = jax.ShapeDtypeStruct((4,), np.int64)
    f = jax.ffi.ffi_call("sd.Counter", out)
    calls, failed, errors = 0, 0, []
    print("ready", flush=True)
    while not select.select([sys.stdin], [], [], 0)[0]:
      try:
        np.asarray(f(x))
        calls += 1
      except Exception as e:
        failed += 1
        errors.append(str(e)[:300])
    print(json.dumps({"calls": calls, "failed": failed,
                      "errors": errors[:5]}), flush=True)
""")


def boot_script(root: pathlib.Path) -> str:
  kregd = os.path.realpath(daemon_binary())
  kernels = os.path.realpath(ku.kernels_dir())
  units = REPO_ROOT / "daemon" / "systemd"
  drop_in = textwrap.dedent(f"""\
      [Unit]
      DefaultDependencies=no
      [Service]
      ExecStart=
      ExecStart={kregd} --allow-root {kernels} --orphan-timeout 60
      StandardOutput=append:{root}/kregd.log
      StandardError=inherit
      """)
  socket_drop_in = "[Unit]\nDefaultDependencies=no\n"
  target = textwrap.dedent("""\
      [Unit]
      DefaultDependencies=no
      Wants=kregd.socket kregd.service
      """)
  masked = ["systemd-tmpfiles-setup.service",
            "systemd-tmpfiles-setup-dev.service",
            "systemd-tmpfiles-clean.service", "systemd-tmpfiles-clean.timer",
            "tmp.mount", "sysinit.target", "basic.target",
            "multi-user.target", "systemd-journald.service",
            "systemd-journald.socket", "systemd-journald-dev-log.socket"]
  lines = [
      "set -e",
      "mount -t tmpfs tmpfs /run",
      "mount -t tmpfs tmpfs /etc/systemd/system",
      f"mkdir -p {root}/var-lib {root}/var-cache",
      f"mount --bind {root}/var-lib /var/lib",
      f"mount --bind {root}/var-cache /var/cache",
      "mkdir -p /run/systemd/system/kregd.service.d "
      "/run/systemd/system/kregd.socket.d",
      f"cp {units}/kregd.service {units}/kregd.socket /run/systemd/system/",
      f"cat > /run/systemd/system/kregd.service.d/test.conf <<'EOF'\n"
      f"{drop_in}EOF",
      f"cat > /run/systemd/system/kregd.socket.d/test.conf <<'EOF'\n"
      f"{socket_drop_in}EOF",
      f"cat > /run/systemd/system/kreg-test.target <<'EOF'\n{target}EOF",
  ]
  lines += [f"ln -s /dev/null /run/systemd/system/{u}" for u in masked]
  lines.append("export container=kreg-test")
  lines.append(f"exec {SYSTEMD} --system --unit=kreg-test.target "
               "--log-target=console --log-level=notice")
  return "\n".join(lines) + "\n"


class Booted:
  """systemd as PID 1 of new namespaces, and commands run inside them."""

  def __init__(self, root: pathlib.Path):
    self.root = root
    (root / "boot.sh").write_text(boot_script(root))
    self.log = open(root / "systemd.log", "wb")
    self.unshare = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount", "--mount-proc",
         "--propagation", "private", "sh", str(root / "boot.sh")],
        stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
    self.pid = 0
    # Generous: a loaded machine starts processes slowly.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not self.pid:
      kids = pathlib.Path(f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/"
                          "children")
      try:
        first = kids.read_text().split()
      except OSError:
        break
      for k in first:
        try:
          if os.readlink(f"/proc/{k}/exe").endswith("systemd"):
            self.pid = int(k)
        except OSError:
          pass
      time.sleep(0.05)

  def run(self, *args, **kw):
    return subprocess.run(["nsenter", "-t", str(self.pid), "-m", "-p", *args],
                          capture_output=True, text=True, timeout=60, **kw)

  def popen(self, args, **kw):
    return subprocess.Popen(["nsenter", "-t", str(self.pid), "-m", "-p",
                             *args], **kw)

  def main_pid(self) -> int:
    r = self.run("systemctl", "show", "-p", "MainPID", "--value", "kregd")
    return int(r.stdout.strip() or 0)

  def active(self) -> bool:
    r = self.run("systemctl", "is-active", "kregd")
    return r.stdout.strip() == "active"

  def close(self):
    if self.pid:
      # Stopped units remove what they made on the host (PrivateTmp=).
      self.run("systemctl", "stop", "kregd.service", "kregd.socket")
      try:
        os.kill(self.pid, signal.SIGKILL)  # ends the whole PID namespace
      except ProcessLookupError:
        pass
    try:
      self.unshare.wait(timeout=20)
    except subprocess.TimeoutExpired:
      self.unshare.kill()
      self.unshare.wait()
    self.log.close()


def logs(root: pathlib.Path) -> str:
  out = []
  for name in ("systemd.log", "kregd.log"):
    try:
      out.append(f"--- {name}\n" + (root / name).read_text(
          errors="replace")[-6000:])
    except OSError:
      pass
  return "\n".join(out)


@pytest.fixture
def booted():
  if os.geteuid() != 0:
    pytest.skip("booting systemd in a namespace needs root")
  if not os.path.exists(SYSTEMD) or shutil.which("nsenter") is None:
    pytest.skip(f"{SYSTEMD} or nsenter is not installed")
  try:
    ku.kernel_path("libhostile.so")
  except FileNotFoundError as e:
    pytest.skip(str(e))
  if not daemon_binary().is_file():
    pytest.skip("kregd not built")
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-systemd-", dir="/tmp"))
  b = Booted(root)
  try:
    if not b.pid:
      pytest.skip("systemd did not boot in a new PID namespace here:\n" +
                  logs(root))
    # Booting systemd and starting kregd under it: generous, for a loaded
    # machine (a fresh-clone run beside other work took over 30 s).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not b.active():
      time.sleep(0.1)
    assert b.active(), logs(root)
    yield b
  finally:
    b.close()
    if os.environ.get("KREG_KEEP_TEST_DIRS") is None:
      shutil.rmtree(root, ignore_errors=True)


def test_systemctl_restart_during_a_call_loop_fails_no_call(booted):
  env = dict(os.environ)
  env["KREGD_SOCKET"] = "/run/kregd/kregd.sock"
  env["PYTHONPATH"] = os.pathsep.join(
      [str(REPO_ROOT / "client" / "python"),
       str(pathlib.Path(__file__).resolve().parent),
       env.get("PYTHONPATH", "")])
  env["JAX_PLATFORMS"] = "cpu"
  client = booted.popen([sys.executable, "-c", CLIENT], env=env,
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
  try:
    assert client.stdout.readline().strip() == "ready", client.stderr.read()
    pids = [booted.main_pid()]
    for _ in range(3):
      time.sleep(1.0)
      r = booted.run("systemctl", "restart", "kregd")
      assert r.returncode == 0, r.stderr + logs(booted.root)
      assert booted.active(), logs(booted.root)
      pids.append(booted.main_pid())
    time.sleep(1.0)
    client.stdin.write("stop\n")
    client.stdin.flush()
    out, err = client.communicate(timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
  finally:
    if client.poll() is None:
      client.kill()
      client.wait()
  # kregd really restarted, three times.
  assert len(set(pids)) == 4 and 0 not in pids, pids
  assert result["failed"] == 0, (result, err[-3000:], logs(booted.root))
  assert result["calls"] > 100, result
  text = logs(booted.root)
  assert "re-adopted executor pid" in text, text
