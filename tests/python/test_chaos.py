"""Restarts fail no call (DESIGN §12), under chaos: 8 JAX processes call
forwarded CPU targets (and register new ones now and then) while kregd is
SIGTERMed and restarted, kill -9ed and restarted, and executors are kill
-9ed, at random moments. No result may be wrong, no registration that
succeeded may be lost, no call may fail because kregd restarted, and an
executor kill may fail only the call in flight on that executor, with a
message naming the executor."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import kernels_util as ku
from kregd_proc import finish_test_daemon, run_kregctl, start_test_daemon

PY = sys.executable
CLIENTS = 8
SECONDS = 60
EVENTS = 10  # of each kind

CLIENT = r"""
import json, os, sys, time
import jax, numpy as np
import kreg, kernels_util as ku
me, stop = sys.argv[1], sys.argv[2]
lib = ku.kernel_path("libdemo.so")
kreg.register_ffi_target("chaos.scale", lib, "Scale", platform="cpu")
f = jax.jit(lambda v, k: jax.ffi.ffi_call(
    "chaos.scale", jax.ShapeDtypeStruct(v.shape, v.dtype))(
        v * k, factor=np.float32(3)))
rng = np.random.default_rng(int(me))
ok = failed = wrong = 0
errors, registered = [], []
last_register = time.monotonic()
print(json.dumps({"ready": True}), flush=True)
while not os.path.exists(stop):
  x = rng.normal(size=64).astype(np.float32)
  k = np.float32(rng.integers(1, 5))
  try:
    y = np.asarray(f(x, k))
    if np.array_equal(y, (x * k) * np.float32(3)):
      ok += 1
    else:
      wrong += 1
  except Exception as e:  # pylint: disable=broad-except
    failed += 1
    errors.append(str(e)[:600])
  if time.monotonic() - last_register > 4:
    name = f"chaos.c{me}.n{len(registered)}"
    try:
      kreg.register_ffi_target(name, lib, "Scale", platform="cpu")
      registered.append(name)
    except Exception as e:  # pylint: disable=broad-except
      errors.append("register: " + str(e)[:600])
      failed += 1
    last_register = time.monotonic()
print(json.dumps({"ok": ok, "failed": failed, "wrong": wrong,
                  "errors": errors, "registered": registered}), flush=True)
"""


def executor_pids(d):
  try:
    return [e["pid"] for e in d.status()["executors"]]
  except Exception:  # pylint: disable=broad-except
    return []


def test_chaos_restarts_fail_no_call(tmp_path):
  try:
    ku.kernel_path("libdemo.so")
  except FileNotFoundError as e:
    pytest.skip(str(e))
  # No quarantine: the executor kills are the test's, not the kernel's.
  d = start_test_daemon("kreg-chaos-", ["--orphan-timeout", "120",
                                        "--quarantine-crashes", "0"])
  stop = tmp_path / "stop"
  procs = []
  rng = random.Random(1234)
  kills = []  # executor pids killed
  try:
    for i in range(CLIENTS):
      p = subprocess.Popen([PY, "-c", CLIENT, str(i), str(stop)],
                           env=d.env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
      procs.append(p)
    for p in procs:
      assert json.loads(p.stdout.readline()) == {"ready": True}, (
          p.stderr.read() if p.poll() is not None else "")
    events = (["term"] * EVENTS + ["kill"] * EVENTS + ["exec"] * EVENTS)
    rng.shuffle(events)
    start = time.monotonic()
    for n, what in enumerate(events):
      # Spread over SECONDS, at random moments within each step.
      at = start + SECONDS * (n + rng.random()) / len(events)
      time.sleep(max(0.0, at - time.monotonic()))
      if what == "exec":
        pids = executor_pids(d)
        if pids:
          pid = rng.choice(pids)
          try:
            os.kill(pid, signal.SIGKILL)
            kills.append(pid)
          except ProcessLookupError:
            pass
      else:
        d.stop(signal.SIGTERM if what == "term" else signal.SIGKILL)
        d.start()
    time.sleep(2)
    stop.touch()
    results = []
    for p in procs:
      out, err = p.communicate(timeout=180)
      assert p.returncode == 0, err[-3000:]
      results.append(json.loads(out.strip().splitlines()[-1]))
  finally:
    stop.touch()
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  try:
    calls = sum(r["ok"] + r["failed"] + r["wrong"] for r in results)
    assert calls > 200, results
    assert sum(r["wrong"] for r in results) == 0, results
    errors = [e for r in results for e in r["errors"]]
    # Restarts fail nothing; an executor kill fails at most the call in
    # flight on it, naming the executor.
    for e in errors:
      assert "kregd executor" in e and "killed by signal 9" in e, e
    assert len(errors) <= len(kills), (errors, kills)
    # Every registration that succeeded is still there.
    listed = {t["target_name"]
              for t in json.loads(run_kregctl(d, "list", "--json").stdout)}
    registered = [n for r in results for n in r["registered"]]
    assert registered, results
    assert set(registered) <= listed, set(registered) - listed
  finally:
    finish_test_daemon(d)
