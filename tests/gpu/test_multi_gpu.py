"""One kregd serving JAX processes on two GPUs.

Skipped, with the reason, where fewer than two CUDA devices are visible.
tests/gpu/run.sh runs this file in a pass of its own (its clients need GPU
memory that the other GPU tests' JAX process would hold).

The module starts its own kregd (seeing the GPUs this process sees, with
`--log-level debug`) and three concurrent client processes
(multi_gpu_client.py), released together through a file barrier:

  gpu0  CUDA_VISIBLE_DEVICES=0: kregd's device 0, its own ordinal 0
  gpu1  CUDA_VISIBLE_DEVICES=1: kregd's device 1, its own ordinal 0 (kregd
        must match it by UUID, not ordinal)
  both  both devices, through jax.devices()

Each runs, on every device it has, every CUDA reference handler forwarded
through kregd against the same handler in-process (cuda_cases.DEVICE_CASES)
and kreg.numba_cuda_callable against XLA.

What kregd says about mappings is read from its log (debug level):
  * per shared client allocation (daemon/executor/cuda_executor.cc):
    "session S (pid P): allocation 0x.. (+N bytes, generation G) on <client
    UUID> shared as CUDA mapping 0x<kregd base> on kregd device K <UUID>"
  * per mapping kregd makes or releases (daemon/executor/cuda/cuda_mapping.cc):
    "CUDA mapping 0x<base> (+N bytes, VMM import|IPC open) mapped on kregd
    device K <UUID>; driver: resident on device R" and
    "CUDA mapping 0x<base> (+N bytes) on kregd device K <UUID> released"
  * kregd's devices: "CUDA device K: <UUID> (...)"; sessions: "session S:
    uid U gid G pid P ..."; doorbells: "session S: CUDA doorbell set up for
    <UUID>"; "session S (pid P) closed".
Sessions come from `kregctl status --json` (gRPC).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from gpu_devices import NoCudaDriver, cuda_device_uuids

HERE = pathlib.Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]

try:
  UUIDS = cuda_device_uuids()
  _WHY = f"{len(UUIDS)} CUDA device(s) visible"
except NoCudaDriver as _e:
  UUIDS = []
  _WHY = str(_e)
if len(UUIDS) < 2:
  pytest.skip(f"the two-GPU suite needs two CUDA GPUs: {_WHY}",
              allow_module_level=True)

# pylint: disable=wrong-import-position
import cuda_cases  # noqa: E402
from kregd_proc import Daemon  # noqa: E402
from proc_barrier import Barrier, wait_for  # noqa: E402

CLIENTS = ("gpu0", "gpu1", "both")
CLIENT_TIMEOUT_S = 600
# Two client processes share each GPU: keep XLA's preallocation below half.
CLIENT_MEM_FRACTION = "0.3"

RE_DEVICE = re.compile(r"CUDA device (\d+): (GPU-[0-9a-f-]+) ")
RE_SESSION = re.compile(r"session (\d+): uid \d+ gid \d+ pid (\d+) ")
RE_SHARED = re.compile(
    r"session (\d+) \(pid (\d+)\): allocation 0x([0-9a-f]+) \(\+(\d+) bytes, "
    r"generation (\d+)\) on (\S+) shared as CUDA mapping 0x([0-9a-f]+) on "
    r"kregd device (\d+) (GPU-[0-9a-f-]+)")
RE_MAPPED = re.compile(
    r"CUDA mapping 0x([0-9a-f]+) \(\+(\d+) bytes, ([^)]+)\) mapped on kregd "
    r"device (\d+) (GPU-[0-9a-f-]+); driver: resident on device (.*)$")
RE_RELEASED = re.compile(
    r"CUDA mapping 0x([0-9a-f]+) \(\+(\d+) bytes\) on kregd device (\d+) "
    r"(GPU-[0-9a-f-]+) released")
RE_DOORBELL = re.compile(r"session (\d+): CUDA doorbell set up for (\S+)")
RE_CLOSED = re.compile(r"session (\d+) \(pid (\d+)\) closed")


def _visible_entries() -> list[str]:
  """CUDA_VISIBLE_DEVICES values naming this process's ordinals 0, 1, ..."""
  vis = os.environ.get("CUDA_VISIBLE_DEVICES")
  if vis:
    return [v.strip() for v in vis.split(",")]
  return [str(i) for i in range(len(UUIDS))]


def _client_env(kregd: Daemon, name: str) -> dict[str, str]:
  env = dict(os.environ)
  env["KREGD_SOCKET"] = kregd.socket
  env["PYTHONPATH"] = os.pathsep.join(
      [str(HERE), str(REPO_ROOT / "tests" / "python"),
       str(REPO_ROOT / "client" / "python"), env.get("PYTHONPATH", "")])
  env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = CLIENT_MEM_FRACTION
  env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
  env.pop("JAX_PLATFORMS", None)
  entries = _visible_entries()
  if name == "gpu0":
    env["CUDA_VISIBLE_DEVICES"] = entries[0]
  elif name == "gpu1":
    env["CUDA_VISIBLE_DEVICES"] = entries[1]
  elif "CUDA_VISIBLE_DEVICES" in os.environ or len(UUIDS) > 2:
    env["CUDA_VISIBLE_DEVICES"] = ",".join(entries[:2])
  # else: "both" sees exactly what kregd sees (two GPUs), unpinned.
  return env


@dataclasses.dataclass
class Run:
  kregd_devices: dict[int, str]  # kregd ordinal -> UUID, from its log
  reports: dict[str, dict]  # client name -> multi_gpu_client.py's report
  returncodes: dict[str, int]
  outputs: dict[str, str]  # client name -> the end of its output
  sessions_while_open: int
  sessions_after: int
  log: str  # kregd's whole log

  def expected_uuids(self, name: str) -> list[str]:
    return {"gpu0": [UUIDS[0]], "gpu1": [UUIDS[1]],
            "both": [UUIDS[0], UUIDS[1]]}[name]

  def pid(self, name: str) -> int:
    return self.reports[name]["pid"]

  def lines(self, regex: re.Pattern) -> list[re.Match]:
    return [m for m in (regex.search(l) for l in self.log.splitlines()) if m]


def _tail(path: pathlib.Path, n: int = 6000) -> str:
  try:
    return path.read_text(errors="replace")[-n:]
  except OSError:
    return "(no output)"


def _mapping_balance(log: str) -> tuple[dict, list[str]]:
  """Replays kregd's mapped/released lines: (base -> still mapped line, the
  inconsistencies: a base mapped twice without a release in between, or
  released without being mapped)."""
  live, problems = {}, []
  for line in log.splitlines():
    if m := RE_MAPPED.search(line):
      if m.group(1) in live:
        problems.append(f"mapped again while still mapped: {line}")
      live[m.group(1)] = line
    elif m := RE_RELEASED.search(line):
      if live.pop(m.group(1), None) is None:
        problems.append(f"released without being mapped: {line}")
  return live, problems


@pytest.fixture(scope="module")
def two_gpus(cuda_kernels_dir) -> Run:
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-2gpu-", dir="/tmp"))
  kregd = Daemon(root, [str(cuda_kernels_dir)],
                 extra_args=["--log-level", "debug"])
  try:
    kregd.start(timeout=60)
  except FileNotFoundError as e:
    pytest.skip(str(e))
  (root / "barrier").mkdir()
  barrier = Barrier(root / "barrier")
  procs: dict[str, subprocess.Popen] = {}
  logs = {name: root / f"client-{name}.log" for name in CLIENTS}
  try:
    for name in CLIENTS:
      with open(logs[name], "wb") as out:
        procs[name] = subprocess.Popen(
            [sys.executable, str(HERE / "multi_gpu_client.py"), "--socket",
             kregd.socket, "--kernels", str(cuda_kernels_dir), "--barrier",
             str(barrier.dir), "--name", name, "--out",
             str(root / f"report-{name}.json"), "--timeout",
             str(CLIENT_TIMEOUT_S)],
            env=_client_env(kregd, name), stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    def alive():
      for name, p in procs.items():
        if p.poll() is not None:
          pytest.fail(f"client {name} exited ({p.returncode}):\n"
                      f"{_tail(logs[name])}")
    wait_for(lambda: barrier.arrived("start", CLIENTS), 300,
             "the clients to register", alive)
    barrier.release("start")  # all three work at the same time from here
    wait_for(lambda: barrier.arrived("exit", CLIENTS), CLIENT_TIMEOUT_S,
             "the clients to finish", alive)
    # Every client still holds its session here.
    sessions_while_open = kregd.status()["sessions"]
    reports = {n: json.loads((root / f"report-{n}.json").read_text())
               for n in CLIENTS}
    barrier.release("exit")
    returncodes = {}
    for name, p in procs.items():
      try:
        returncodes[name] = p.wait(timeout=120)
      except subprocess.TimeoutExpired:
        p.kill()
        returncodes[name] = p.wait()
    # kregd closes a session when it sees the client's socket close.
    deadline = time.monotonic() + 60
    while True:
      sessions_after = kregd.status()["sessions"]
      live, _ = _mapping_balance(kregd.log(tail=None))
      if (sessions_after == 0 and not live) or time.monotonic() > deadline:
        break
      time.sleep(0.2)
    kregd_devices = {int(m.group(1)): m.group(2)
                     for m in map(RE_DEVICE.search,
                                  kregd.log(tail=None).splitlines()) if m}
    yield Run(kregd_devices=kregd_devices, reports=reports,
              returncodes=returncodes,
              outputs={n: _tail(logs[n]) for n in CLIENTS},
              sessions_while_open=sessions_while_open,
              sessions_after=sessions_after, log=kregd.log(tail=None))
  finally:
    for p in procs.values():
      if p.poll() is None:
        p.kill()
        p.wait()
    kregd.stop()
    # run.sh sets KREG_TEST_LOG_DIR: kregd's and the clients' logs survive.
    if os.environ.get("KREG_TEST_LOG_DIR"):
      keep = pathlib.Path(os.environ["KREG_TEST_LOG_DIR"])
      keep.mkdir(parents=True, exist_ok=True)
      for f in list(root.glob("*.log")) + list(root.glob("report-*.json")):
        shutil.copy(f, keep / f.name)
    if os.environ.get("KREG_KEEP_TEST_DIRS") is None:
      shutil.rmtree(root, ignore_errors=True)
    else:
      print(f"test_multi_gpu: kept {root}")


def test_kregd_serves_both_gpus(two_gpus):
  # kregd runs with this process's environment: its ordinals are ours.
  assert two_gpus.kregd_devices == dict(enumerate(UUIDS)), (
      two_gpus.kregd_devices, UUIDS, two_gpus.log[-3000:])


@pytest.mark.parametrize("name", CLIENTS)
def test_client_sees_its_devices(two_gpus, name):
  report = two_gpus.reports[name]
  assert two_gpus.returncodes[name] == 0, two_gpus.outputs[name]
  assert [d["uuid"] for d in report["devices"]] == \
      two_gpus.expected_uuids(name), report["devices"]
  if name != "both":
    # Pinned: its only device is its ordinal 0 (for gpu1, kregd's 1).
    assert [d["ordinal"] for d in report["devices"]] == [0]


@pytest.mark.parametrize("name", CLIENTS)
def test_every_handler_equals_in_process_on_each_device(two_gpus, name):
  report = two_gpus.reports[name]
  failed = [f"{r['device']} {r['case']}:\n{r['error']}"
            for r in report["results"]
            if not r["ok"] and not r["case"].startswith("numba.")]
  assert not failed, "\n".join(failed)
  passed = collections.defaultdict(set)
  for r in report["results"]:
    if r["ok"]:
      passed[r["device"]].add(r["case"])
  for uuid in two_gpus.expected_uuids(name):
    missing = set(cuda_cases.handler_names()) - passed[uuid]
    assert not missing, f"{name} on {uuid}: not run: {sorted(missing)}"


@pytest.mark.parametrize("name", CLIENTS)
def test_numba_cuda_callable_equals_xla_on_each_device(two_gpus, name):
  report = two_gpus.reports[name]
  if report["numba"] != "available":
    pytest.skip(report["numba"])
  cases = [r for r in report["results"] if r["case"].startswith("numba.")]
  failed = [f"{r['device']} {r['case']}:\n{r['error']}"
            for r in cases if not r["ok"]]
  assert not failed, "\n".join(failed)
  for uuid in two_gpus.expected_uuids(name):
    assert sum(r["device"] == uuid for r in cases) >= 2, (uuid, cases)


def test_no_buffer_mapped_on_the_wrong_device(two_gpus):
  shared = two_gpus.lines(RE_SHARED)
  assert shared, ("kregd logged no shared CUDA mapping at debug level (is "
                  "this kregd built from this commit?):\n" +
                  two_gpus.log[-3000:])
  by_pid = collections.defaultdict(list)
  for m in shared:
    by_pid[int(m.group(2))].append(m)
  for name in CLIENTS:
    lines = by_pid.get(two_gpus.pid(name), [])
    assert lines, f"no mapping logged for client {name}"
    kregd_uuids = set()
    for m in lines:
      client_uuid, ordinal, kregd_uuid = (m.group(6), int(m.group(8)),
                                          m.group(9))
      # The device the client named is the device kregd mapped on, and
      # that is kregd's device of that UUID (not of the client's ordinal).
      assert client_uuid == kregd_uuid, m.group(0)
      assert two_gpus.kregd_devices.get(ordinal) == kregd_uuid, m.group(0)
      kregd_uuids.add(kregd_uuid)
    assert kregd_uuids == set(two_gpus.expected_uuids(name)), (
        name, kregd_uuids)
  # gpu1's buffers (its ordinal 0) went to kregd's device 1.
  assert {int(m.group(8)) for m in by_pid[two_gpus.pid("gpu1")]} == {1}
  # Every mapping kregd made (shares and doorbells) is on memory the driver
  # places on that same device.
  mapped = two_gpus.lines(RE_MAPPED)
  assert mapped
  wrong = [m.group(0) for m in mapped if m.group(6) != m.group(4)]
  assert not wrong, "\n".join(wrong)
  # Doorbells (where memops are available; events otherwise): one for each
  # device the client used, and none for another.
  session_pid = {int(m.group(1)): int(m.group(2))
                 for m in two_gpus.lines(RE_SESSION)}
  bells = collections.defaultdict(set)
  for m in two_gpus.lines(RE_DOORBELL):
    bells[session_pid.get(int(m.group(1)))].add(m.group(2))
  for name in CLIENTS:
    got = bells.get(two_gpus.pid(name), set())
    if got:
      assert got == set(two_gpus.expected_uuids(name)), (name, got)


def test_sessions_and_mappings_released_after_the_clients_exit(two_gpus):
  assert two_gpus.sessions_while_open >= len(CLIENTS)
  assert two_gpus.sessions_after == 0, two_gpus.log[-3000:]
  live, problems = _mapping_balance(two_gpus.log)
  assert not problems, "\n".join(problems)
  assert not live, "still mapped:\n" + "\n".join(live.values())
  closed = {int(m.group(2)) for m in two_gpus.lines(RE_CLOSED)}
  for name in CLIENTS:
    assert two_gpus.pid(name) in closed, f"no session of {name} closed"
  assert "releasing a client CUDA mapping" not in two_gpus.log
