"""Re-pointing local bindings (docs/replace.md section 4), through the real
kregd with replace = "owner": a process that runs a target locally keeps its
jitted function, and after replace=True returns, its next call runs the new
generation (libdemo_v2.so's Scale multiplies by factor + 1), whether
another process or the holder itself replaced it; a stopped holder makes
the replacement time out naming it, and switches once continued. Under
replace = "deny" a
local bind keeps XLA's direct pointer and opens no watch connection."""

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import kernels_util as ku
import kregd_proc
from holder import Holder
from kregd_proc import run_kregctl as kregctl


@pytest.fixture
def d():
  daemon = kregd_proc.start_test_daemon("kreg-rplocal-",
                                        ["--replace", "owner"])
  yield daemon
  kregd_proc.finish_test_daemon(daemon)


def register(d, name, module, *extra):
  return kregctl(d, "register", name, "--module",
                 str(ku.kernel_path(module)), "--function", "Scale",
                 "--platform", "cpu", *extra)


def test_a_running_local_process_switches_without_rejitting(d):
  register(d, "demo.ver", "libdemo.so")
  p = Holder(d, "demo.ver", "local")
  try:
    assert p.call() == {"y": [0, 2, 4, 6], "traces": 1}
    r = register(d, "demo.ver", "libdemo_v2.so", "--replace")
    assert r.returncode == 0, r.stderr
    assert p.call() == {"y": [0, 3, 6, 9], "traces": 1}
  finally:
    p.end()
  [target] = json.loads(kregctl(d, "show", "demo.ver", "--json").stdout)
  assert target["generation"] == 2
  assert f"(pid {p.pid} uid " in d.log() and "watch connection" in d.log()


@pytest.mark.parametrize("mode", ["local", "isolated"])
def test_a_pinned_binding_keeps_its_generation_and_is_no_laggard(d, mode):
  register(d, "demo.pin", "libdemo.so")
  pinned = Holder(d, "demo.pin", mode, pin=1)
  follows = Holder(d, "demo.pin", mode)
  try:
    assert pinned.call() == {"y": [0, 2, 4, 6], "traces": 1}
    assert follows.call() == {"y": [0, 2, 4, 6], "traces": 1}
    r = register(d, "demo.pin", "libdemo_v2.so", "--replace")
    assert r.returncode == 0, r.stderr
    assert pinned.call() == {"y": [0, 2, 4, 6], "traces": 1}
    assert follows.call() == {"y": [0, 3, 6, 9], "traces": 1}
    # kregctl show says what each runs.
    [target] = json.loads(kregctl(d, "show", "demo.pin", "--json").stdout)
    by = {b["pid"]: b for b in target["bound_by"]}
    assert (by[pinned.pid]["mode"], by[pinned.pid]["generation"]) == (mode, 1)
    assert (by[follows.pid]["mode"], by[follows.pid]["generation"]) == (mode,
                                                                        2)
  finally:
    pinned.end()
    follows.end()


def test_a_stopped_local_holder_times_out_named_and_switches_when_continued():
  d = kregd_proc.start_test_daemon(
      "kreg-rplocal-", ["--replace", "owner", "--replace-timeout", "2"])
  try:
    register(d, "demo.halt", "libdemo.so")
    p = Holder(d, "demo.halt", "local")
    try:
      assert p.call() == {"y": [0, 2, 4, 6], "traces": 1}
      os.kill(p.pid, signal.SIGSTOP)
      try:
        r = kregctl(d, "register", "demo.halt", "--module",
                    str(ku.kernel_path("libdemo_v2.so")), "--function",
                    "Scale", "--platform", "cpu", "--replace", check=False)
      finally:
        os.kill(p.pid, signal.SIGCONT)
      assert r.returncode == 1, r.stdout + r.stderr
      user = pwd.getpwuid(os.geteuid()).pw_name
      assert (f"within replace_timeout (2 s): pid {p.pid} uid {os.geteuid()} "
              f"({user}) host {socket.gethostname()} (local, runs generation "
              "1)") in r.stderr, r.stderr
      # Continued, its watch thread applies the notice kregd sent.
      deadline = time.monotonic() + 60
      while p.call() != {"y": [0, 3, 6, 9], "traces": 1}:
        assert time.monotonic() < deadline, "the continued holder never switched"
      # Its late acknowledgement is what kregctl show reports.
      while True:
        [t] = json.loads(kregctl(d, "show", "demo.halt", "--json").stdout)
        if {b["pid"]: b["generation"] for b in t["bound_by"]}[p.pid] == 2:
          break
        assert time.monotonic() < deadline, "the late acknowledgement is lost"
    finally:
      p.end()
  finally:
    kregd_proc.finish_test_daemon(d)


# The holder replaces the target itself (kreg.register_ffi_target with
# replace=True): its watch thread switches it while the registration waits.
SELF = """
import json, sys
import jax, numpy as np
import kernels_util as ku, kreg
name = sys.argv[1]
kreg.register_ffi_target(name, ku.kernel_path("libdemo.so"), "Scale",
                         platform="cpu", execution="local")
f = jax.jit(lambda x: jax.ffi.ffi_call(
    name, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=np.float32(2)))
x = np.arange(4, dtype=np.float32)
before = np.asarray(f(x)).tolist()
r = kreg.register_ffi_target(name, ku.kernel_path("libdemo_v2.so"), "Scale",
                             platform="cpu", replace=True, execution="local")
after = np.asarray(f(x)).tolist()
print(json.dumps({"before": before, "after": after, "created": r.created}))
"""


def test_the_holder_replaces_its_own_target(d):
  p = subprocess.run([sys.executable, "-c", textwrap.dedent(SELF),
                      "demo.self"], env=d.env(), capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 0, p.stderr
  assert json.loads(p.stdout) == {"before": [0, 2, 4, 6],
                                  "after": [0, 3, 6, 9], "created": True}


def test_under_deny_a_local_bind_opens_no_watch():
  d = kregd_proc.start_test_daemon("kreg-rpdeny-")
  try:
    register(d, "demo.fixed", "libdemo.so")
    p = Holder(d, "demo.fixed", "local")
    try:
      assert p.call() == {"y": [0, 2, 4, 6], "traces": 1}
    finally:
      p.end()
    assert "bound locally" in d.log()
    assert "watch connection" not in d.log()
  finally:
    kregd_proc.finish_test_daemon(d)
