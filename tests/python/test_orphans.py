"""Executors outlive kregd (DESIGN §12): a kregd that stops or dies leaves
the executors serving their sessions; calls in flight finish on them, the
handlers they loaded keep running (their globals too), what needs kregd
moves the client to a new session with the next kregd, and an orphan exits
when its sessions close or after orphan_timeout."""

import json
import os
import pathlib
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time

import pytest

import kernels_util as ku
from kregd_proc import finish_test_daemon, start_test_daemon

PY = sys.executable

# Registers hostile Counter and Nap, calls Counter (prints [calls, pid]),
# waits for "go", then naps `ms` and prints the nap's [uid, gid, pid, ppid],
# calls Counter again, registers and calls WhoAmI (a target new to this
# session: it needs kregd), and waits for "end".
CLIENT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    import kreg, kernels_util as ku
    lib = ku.kernel_path("libhostile.so")
    for f in ("Counter", "Nap"):
      kreg.register_ffi_target("orphan." + f, lib, f, platform="cpu")
    x = np.zeros(4, np.float32)
    out = jax.ShapeDtypeStruct((4,), np.int64)
    def call(name, **kw):
      try:
        return {"ok": np.asarray(
            jax.ffi.ffi_call(name, out)(x, **kw)).tolist()}
      except Exception as e:
        return {"error": str(e)}
    def say(v):
      print(json.dumps(v), flush=True)
    say(call("orphan.Counter"))
    sys.stdin.readline()
    say(call("orphan.Nap", ms=np.int64(int(sys.argv[1]))))
    say(call("orphan.Counter"))
    kreg.register_ffi_target("orphan.WhoAmI", lib, "WhoAmI", platform="cpu")
    say(call("orphan.WhoAmI"))
    sys.stdin.readline()
""")


def alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"
  except OSError:
    return False


def wait_gone(pid: int, seconds: float) -> bool:
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if not alive(pid):
      return True
    time.sleep(0.05)
  return False


@pytest.fixture
def hostile():
  try:
    return ku.kernel_path("libhostile.so")
  except FileNotFoundError as e:
    pytest.skip(str(e))


def start_client(d, nap_ms):
  p = subprocess.Popen([PY, "-c", CLIENT, str(nap_ms)], env=d.env(),
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  first = json.loads(p.stdout.readline() or "{}")
  assert "ok" in first, (first, p.stderr.read() if p.poll() is not None
                         else "")
  assert first["ok"][0] == 0
  return p, first["ok"][1]  # the executor's pid


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_call_in_flight_finishes_across_a_kregd_restart(hostile, how):
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "60"])
  p = None
  try:
    p, executor = start_client(d, 2500)
    p.stdin.write("go\n")
    p.stdin.flush()
    time.sleep(0.8)  # the nap runs in the executor
    d.stop(how)
    assert alive(executor), "the executor died with kregd"
    d.start()
    nap, counter, who = (json.loads(p.stdout.readline()) for _ in range(3))
    # The nap finished where it ran, once; the handler's globals went on.
    assert nap.get("ok", [0, 0, 0])[2] == executor, nap
    assert counter == {"ok": [1, executor, 0, 0]}, counter
    # The new kregd re-adopted the executor: a target new to the session,
    # which needs kregd, resolved through it on the same session and ran
    # on the same executor.
    assert "ok" in who, who
    assert who["ok"][2] == executor, who
    assert f"re-adopted executor pid {executor}" in d.log(), d.log()
    assert executor in [e["pid"] for e in d.status()["executors"]]
    p.stdin.write("end\n")
    p.stdin.flush()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "was run again" not in err, err
    assert "may have partly run" not in err, err
    if how == signal.SIGTERM:
      assert "leaving 1 executor(s) running for their sessions" in d.log()
    # Supervised again: the kregd that adopted it stops it when it stops.
    finish_test_daemon(d)
    assert wait_gone(executor, 10), "the re-adopted executor outlived kregd"
  finally:
    if p is not None and p.poll() is None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


def test_an_orphan_ends_its_sessions_after_orphan_timeout(hostile):
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "2"])
  p = None
  try:
    p, executor = start_client(d, 0)
    d.stop(signal.SIGKILL)  # no kregd comes back
    assert alive(executor)
    started = time.monotonic()
    assert wait_gone(executor, 15), "the orphan outlived orphan_timeout"
    assert time.monotonic() - started > 1.0
  finally:
    if p is not None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


def test_orphan_timeout_zero_stops_executors_with_kregd(hostile):
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "0"])
  p = None
  try:
    p, executor = start_client(d, 0)
    d.stop(signal.SIGKILL)
    assert wait_gone(executor, 5), "the executor outlived kregd"
  finally:
    if p is not None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


@pytest.mark.parametrize("value,why", [
    ("-1", "-1"), ("86401", "86401"), ("soon", "soon")])
def test_a_bad_orphan_timeout_is_refused(tmp_path, value, why):
  from kregd_proc import daemon_binary
  p = subprocess.run([str(daemon_binary()), "--socket",
                      str(tmp_path / "s"), "--state-dir",
                      str(tmp_path / "st"), "--orphan-timeout", value],
                     capture_output=True, text=True, timeout=30)
  assert p.returncode == 2, p.stderr
  assert "--orphan-timeout" in p.stderr and why in p.stderr, p.stderr


def test_an_executor_the_next_kregd_cannot_verify_stays_an_orphan(hostile):
  # A new adoption secret (the old one removed): the executor's key does
  # not verify, so the new kregd refuses it and it goes on as an orphan.
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "60"])
  p = None
  try:
    p, executor = start_client(d, 1500)
    p.stdin.write("go\n")
    p.stdin.flush()
    time.sleep(0.5)
    d.stop(signal.SIGKILL)
    os.remove(os.path.join(d.state_dir, "executor-adoption.key"))
    d.start()
    nap, counter, who = (json.loads(p.stdout.readline()) for _ in range(3))
    assert nap.get("ok", [0, 0, 0])[2] == executor, nap
    assert counter == {"ok": [1, executor, 0, 0]}, counter
    # WhoAmI needed kregd: a new session with the new kregd's executor.
    assert "ok" in who and who["ok"][2] not in (0, executor), who
    assert "its adoption key does not verify" in d.log(), d.log()
    assert executor not in [e["pid"] for e in d.status()["executors"]]
    p.stdin.write("end\n")
    p.stdin.flush()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert wait_gone(executor, 10), "the orphaned executor did not exit"
  finally:
    if p is not None and p.poll() is None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


# Line-driven: "call NAME" prints the call's result (or error) as JSON.
DRIVEN = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    import kreg, kernels_util as ku
    lib = ku.kernel_path("libhostile.so")
    for f in ("Counter", "Nap", "Segfault"):
      kreg.register_ffi_target("adopt." + f, lib, f, platform="cpu")
    x = np.zeros(4, np.float32)
    out = jax.ShapeDtypeStruct((4,), np.int64)
    for line in sys.stdin:
      words = line.split()
      if not words:
        break
      kw = {"ms": np.int64(int(words[2]))} if len(words) > 2 else {}
      try:
        r = {"ok": np.asarray(
            jax.ffi.ffi_call(words[1], out)(x, **kw)).tolist()}
      except Exception as e:
        r = {"error": str(e)}
      print(json.dumps(r), flush=True)
""")


def driven(d):
  p = subprocess.Popen([PY, "-c", DRIVEN], env=d.env(), stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
  return p


def ask(p, line):
  p.stdin.write(line + "\n")
  p.stdin.flush()
  out = p.stdout.readline()
  assert out, p.stderr.read() if p.poll() is not None else "no answer"
  return json.loads(out)


def wait_for(pred, seconds=10.0):
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if pred():
      return True
    time.sleep(0.05)
  return False


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_the_next_kregd_supervises_a_readopted_executor(hostile, how):
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "60"])
  p = None
  try:
    p = driven(d)
    for i in range(3):
      r = ask(p, "call adopt.Counter")
      assert r["ok"][0] == i, r
    executor = r["ok"][1]
    d.stop(how)
    d.start()
    assert wait_for(lambda: executor in [
        e["pid"] for e in d.status()["executors"]]), d.log()
    status = d.status()
    # Its launch statistics came along (from its status page).
    stats = {t["target_name"]: t for t in status["target_stats"]}
    assert stats["adopt.Counter"]["launches"] == 3, stats
    # Its handler's globals too, on the same session.
    assert ask(p, "call adopt.Counter")["ok"][:2] == [3, executor]
    # A crash on it is blamed and counted by the new kregd.
    crashed = ask(p, "call adopt.Segfault")
    assert "adopt.Segfault" in crashed.get("error", ""), crashed
    assert "SIGSEGV" in crashed["error"], crashed
    assert wait_gone(executor, 10)
    after = d.status()
    assert after["executor_crashes"] == 1, after
    # The next call gets a fresh executor.
    again = ask(p, "call adopt.Counter")
    assert again["ok"][0] == 0 and again["ok"][1] != executor, again
  finally:
    if p is not None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


def frame(payload: bytes) -> bytes:
  return struct.pack("<I", len(payload)) + payload


def varint(n: int) -> bytes:
  out = b""
  while True:
    b = n & 0x7F
    n >>= 7
    if n:
      out += bytes([b | 0x80])
    else:
      return out + bytes([b])


def field(num: int, value) -> bytes:
  if isinstance(value, int):
    return varint(num << 3) + varint(value)
  return varint(num << 3 | 2) + varint(len(value)) + value


def offer(path, payload: bytes, fds=()) -> bytes:
  """Sends one frame to the supervision socket; returns kregd's answer."""
  s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  s.settimeout(15)
  s.connect(path)
  data = frame(payload)
  anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(
      f"{len(fds)}i", *fds))] if fds else []
  s.sendmsg([data], anc)
  answer = b""
  while True:
    chunk = s.recv(65536)
    if not chunk:
      break
    answer += chunk
  s.close()
  return answer


@pytest.mark.parametrize("case,expect", [
    ("garbage", b"does not parse as kreg.v1.ExecReadopt"),
    ("other pid", b"but the connection is from pid"),
    # The key sent in the clear instead of a challenge.
    ("no challenge", b"the offer's challenge has 0 bytes"),
    ("short nonce", b"adoption nonce has 3 bytes"),
    ("too many slots", b"session slots (1 to 65536 allowed)"),
])
def test_the_supervision_socket_refuses_forged_offers(tmp_path, case, expect):
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "60"])
  try:
    path = d.session_socket + ".exec"
    # Bound once the session socket listens.
    assert wait_for(lambda: os.path.exists(path)), d.log()
    assert stat_mode(path) == 0o666
    me = os.getpid()
    fields = {1: me, 2: os.getuid(), 3: os.getgid(),
              4: f"uid {os.getuid()}".encode(), 5: 4, 6: b"n" * 16,
              7: b"k" * 32}
    if case == "other pid":
      fields[1] = 1
    if case == "short nonce":
      fields[6] = b"abc"
    if case == "too many slots":
      fields[5] = 1 << 20
    payload = b"".join(field(k, v) for k, v in fields.items())
    if case == "garbage":
      payload = b"\xff" * 40
    answer = offer(path, payload)
    assert expect in answer, answer
    assert wait_for(lambda: expect.decode() in d.log()), d.log()
    # kregd goes on serving; nothing was adopted.
    assert me not in [e["pid"] for e in d.status()["executors"]]
    assert d.running()
  finally:
    finish_test_daemon(d)


def stat_mode(path):
  return os.stat(path).st_mode & 0o777


def upgraded(part: str) -> pathlib.Path:
  from kregd_proc import daemon_binary
  b = daemon_binary().parent / f"kregd_next_{part}"
  if not b.is_file():
    pytest.skip(f"{b} not built")
  return b


def test_an_upgrade_to_the_next_minor_readopts_running_executors(hostile):
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "60"])
  p = None
  try:
    p = driven(d)
    executor = ask(p, "call adopt.Counter")["ok"][1]
    p.stdin.write("call adopt.Nap 1500\n")
    p.stdin.flush()
    time.sleep(0.5)  # the nap runs
    d.stop(signal.SIGTERM)
    d.binary = upgraded("minor")
    d.start()
    nap = json.loads(p.stdout.readline())
    assert nap.get("ok", [0, 0, 0])[2] == executor, nap
    assert wait_for(lambda: executor in [
        e["pid"] for e in d.status()["executors"]]), d.log()
    assert "executors speak session protocol 2.1" in d.log(), d.log()
    assert ask(p, "call adopt.Counter")["ok"][:2] == [1, executor]
  finally:
    if p is not None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


def test_an_upgrade_to_the_next_major_drains_running_executors(hostile):
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "60"])
  p = None
  try:
    p = driven(d)
    executor = ask(p, "call adopt.Counter")["ok"][1]
    p.stdin.write("call adopt.Nap 1500\n")
    p.stdin.flush()
    time.sleep(0.5)
    d.stop(signal.SIGTERM)
    d.binary = upgraded("major")
    d.start()
    # The call in flight is answered, then the drained executor exits.
    nap = json.loads(p.stdout.readline())
    assert nap.get("ok", [0, 0, 0])[2] == executor, nap
    assert wait_gone(executor, 10), d.log()
    assert "draining the executor of" in d.log(), d.log()
    assert "speaks session protocol 2.0 and this kregd 3.x" in d.log()
    # The next call runs on the new kregd's executor, without an error.
    again = ask(p, "call adopt.Counter")
    assert again["ok"][0] == 0 and again["ok"][1] != executor, again
    p.stdin.close()
    err = p.stderr.read()
    assert "may have partly run" not in err, err
  finally:
    if p is not None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


def test_stalled_connections_cannot_hold_the_supervision_socket():
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "60"])
  stalled = []
  try:
    path = d.session_socket + ".exec"
    assert wait_for(lambda: os.path.exists(path)), d.log()
    for _ in range(4):  # kMaxOffersPerUid: each read for up to 5 s
      s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
      s.connect(path)
      stalled.append(s)
    time.sleep(0.3)
    extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    extra.settimeout(3)
    extra.connect(path)
    started = time.monotonic()
    assert extra.recv(64) == b""  # closed at once, unread
    assert time.monotonic() - started < 2
    extra.close()
    assert wait_for(lambda: "4 of that uid; at most 16, 4 per uid" in d.log())
    # The stalled ones end at the offer deadline with the reason.
    stalled[0].settimeout(10)
    answer = stalled[0].recv(4096)
    assert b"did not arrive whole within 5 s" in answer, answer
  finally:
    for s in stalled:
      s.close()
    finish_test_daemon(d)


def test_a_supervision_socket_that_cannot_be_bound_only_costs_readoption():
  import tempfile
  from kregd_proc import Daemon
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-orphan-", dir="/tmp"))
  d = Daemon(root, [os.path.realpath(ku.kernels_dir())],
             ["--orphan-timeout", "60"])
  (root / "kregd.sock.session.exec").mkdir()  # in the way
  try:
    d.start()
    assert wait_for(lambda: "cannot be re-adopted by the next one" in d.log())
    assert "supervision socket" in d.log() and "not a socket" in d.log(), \
        d.log()
    assert d.status()["state_dir"]  # kregd serves on
  finally:
    finish_test_daemon(d)


def read_varint(b: bytes, i: int):
  n = shift = 0
  while True:
    n |= (b[i] & 0x7F) << shift
    shift += 7
    i += 1
    if b[i - 1] < 0x80:
      return n, i


def parse(payload: bytes) -> dict:
  """A protobuf message's varint and length-delimited fields by number."""
  out, i = {}, 0
  while i < len(payload):
    key, i = read_varint(payload, i)
    if key & 7 == 0:
      out[key >> 3], i = read_varint(payload, i)
    else:
      assert key & 7 == 2, payload
      n, i = read_varint(payload, i)
      out[key >> 3], i = payload[i:i + n], i + n
  return out


def adoption_key(state_dir: str, offer: dict) -> bytes:
  """The key kregd gave the executor an ExecReadopt's fields name
  (daemon/base/adoption.cc's AdoptionKey)."""
  import hashlib
  import hmac
  with open(os.path.join(state_dir, "executor-adoption.key"), "rb") as f:
    secret = f.read()
  m = b"kregd executor adoption 1;"
  for v in (offer[6], str(offer.get(2, 0)).encode(),
            str(offer.get(3, 0)).encode(),
            offer[4], str(offer[5]).encode(), offer.get(8, b"")):
    m += str(len(v)).encode() + b":" + v + b";"
  return hmac.new(secret, m, hashlib.sha256).digest()


def read_frame(s) -> bytes:
  data = b""
  while len(data) < 4 or len(data) < 4 + struct.unpack("<I", data[:4])[0]:
    chunk = s.recv(65536)
    assert chunk, data
    data += chunk
  return data[4:]


def test_kregd_proves_the_adoption_key_by_challenge_without_sending_it():
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "60"])
  try:
    path = d.session_socket + ".exec"
    assert wait_for(lambda: os.path.exists(path)), d.log()
    challenge = os.urandom(32)
    fields = {1: os.getpid(), 2: os.getuid(), 3: os.getgid(),
              4: f"uid {os.getuid()}".encode(), 5: 4, 6: b"n" * 16,
              8: b"sha256:x", 9: 1, 10: 8, 14: challenge}
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(15)
    s.connect(path)
    s.sendall(frame(b"".join(field(k, v) for k, v in fields.items())))
    raw = read_frame(s)
    reply = parse(raw)
    # HMAC-SHA256 under the executor's key of its challenge, and kregd's
    # own challenge; the key itself is not sent.
    import hashlib
    import hmac
    key = adoption_key(d.state_dir, fields)
    assert reply.get(3) == hmac.new(
        key, b"kregd supervision 1: kregd;" + challenge,
        hashlib.sha256).digest(), reply
    assert len(reply.get(4, b"")) == 32, reply
    assert key not in raw
    # A forger cannot answer kregd's challenge.
    s.sendall(frame(field(1, b"p" * 32)))
    answer = b""
    while chunk := s.recv(65536):
      answer += chunk
    s.close()
    assert b"its adoption key does not verify" in answer, answer
    assert wait_for(lambda: "its adoption key does not verify" in d.log())
    assert os.getpid() not in [e["pid"] for e in d.status()["executors"]]
    # kregd answers only for executors of the connecting uid: no proof
    # of another uid's key, which a squatter could relay to its executor.
    fields[2] = os.getuid() + 1
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(15)
    s.connect(path)
    s.sendall(frame(b"".join(field(k, v) for k, v in fields.items())))
    raw = read_frame(s)
    s.close()
    assert 3 not in parse(raw), raw
    assert (f"claims uid {os.getuid() + 1} but the connection is from uid "
            f"{os.getuid()}").encode() in raw, raw
  finally:
    finish_test_daemon(d)


# Binds the supervision socket as kregd's restart leaves it free, as uid
# argv[2] (listen() after the switch: connections' SO_PEERCRED name it),
# answers the first frame it reads with argv[3] (hex), and prints what it
# received and how many descriptors came with it.
SQUATTER = textwrap.dedent("""
    import json, os, socket, sys
    path, uid, answer = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o666)
    if uid != os.getuid():
      os.setgroups([])
      os.setresgid(uid, uid, uid)
      os.setresuid(uid, uid, uid)
    s.listen(8)
    print("listening", flush=True)
    s.settimeout(30)
    c, _ = s.accept()
    c.settimeout(2)
    data, fds = b"", 0
    while True:
      try:
        msg, anc, _, _ = c.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4))
      except socket.timeout:
        break
      fds += sum(len(a[2]) // 4 for a in anc)
      if not msg:
        break
      data += msg
      if answer:
        c.sendall(answer)
        answer = b""
    print(json.dumps({"data": data.hex(), "fds": fds}), flush=True)
""")


@pytest.mark.parametrize("who", ["another uid", "kregd's uid"])
def test_an_executor_offers_itself_only_to_a_verified_kregd(hostile, who):
  # A squatter on the supervision socket while kregd restarts
  # gets nothing of an orphaned executor, and forges no adoption.
  if who == "another uid" and os.getuid() != 0:
    pytest.skip("needs root to listen as another uid")
  uid = 65534 if who == "another uid" else os.getuid()
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "60"])
  p = sq = None
  try:
    p = driven(d)
    executor = ask(p, "call adopt.Counter")["ok"][1]
    d.stop(signal.SIGKILL)
    path = d.session_socket + ".exec"
    if os.path.exists(path):
      os.unlink(path)  # the dead kregd's
    # A forged "adopted" once the executor has said something.
    forged = frame(field(3, b"p" * 32) + field(4, b"c" * 32))
    sq = subprocess.Popen([PY, "-c", SQUATTER, path, str(uid), forged.hex()],
                          stdout=subprocess.PIPE, text=True)
    assert sq.stdout.readline().strip() == "listening"
    got = json.loads(sq.stdout.readline() or "{}")
    assert sq.wait(timeout=30) == 0
    data = bytes.fromhex(got["data"])
    # Neither its status page nor a client's session socket nor a broker.
    assert got["fds"] == 0, got
    if who == "another uid":
      assert data == b"", data
      assert wait_for(lambda: (
          f"is bound by uid {uid} (pid {sq.pid}), not by kregd's uid "
          f"{os.getuid()}; nothing was offered") in d.log()), d.log()
      # It tries again; the real kregd, once back, re-adopts it.
      d.start()
      assert wait_for(lambda: executor in [
          e["pid"] for e in d.status()["executors"]], 20), d.log()
    else:
      # Who it is and its challenge, then an empty proof (kregd's was
      # wrong); not its key.
      n = struct.unpack("<I", data[:4])[0]
      assert data[4 + n:] == frame(b""), data
      hello = parse(data[4:4 + n])
      assert 7 not in hello and len(hello[14]) == 32, hello
      assert adoption_key(d.state_dir, hello) not in data
      assert wait_for(lambda: (
          f"(pid {sq.pid}, uid {uid}) did not prove that it holds this "
          "executor's adoption key") in d.log()), d.log()
      # Like a refusal: it serves on as an orphan and offers itself no more.
      d.start()
      time.sleep(1)  # offers came every 250 ms
      assert executor not in [e["pid"] for e in d.status()["executors"]]
    assert ask(p, "call adopt.Counter")["ok"][:2] == [1, executor]
  finally:
    if sq is not None and sq.poll() is None:
      sq.kill()
      sq.wait()
    if p is not None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


def insecure_daemon(extra_args=()):
  import tempfile
  from kregd_proc import Daemon
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-orphan-", dir="/tmp"))
  return Daemon(root, [os.path.realpath(ku.kernels_dir())], list(extra_args))


@pytest.mark.parametrize("which", ["socket", "state"])
def test_kregd_refuses_directories_others_may_write(which):
  d = insecure_daemon()
  try:
    insecure = d.root if which == "socket" else pathlib.Path(d.state_dir)
    insecure.mkdir(exist_ok=True)
    os.chmod(insecure, 0o1777)  # like /tmp
    with pytest.raises(RuntimeError) as e:
      d.start()
    st = os.stat(insecure)
    assert "kregd exited with 1" in str(e.value), e.value
    assert (f"cannot start: the {which} directory {insecure} (owner uid "
            f"{st.st_uid}, group {st.st_gid}, mode 1777) may be written by "
            "others than kregd") in str(e.value), e.value
    assert "--allow-insecure-dirs" in str(e.value), e.value
    assert not os.path.exists(d.session_socket)
  finally:
    finish_test_daemon(d)


def test_allow_insecure_dirs_starts_with_a_warning():
  d = insecure_daemon(["--allow-insecure-dirs"])
  try:
    os.chmod(d.root, 0o1777)
    d.start()
    assert (f"the socket directory {d.root} (owner uid {os.getuid()}"
            in d.log()), d.log()
    assert "(starting anyway: allow_insecure_dirs = true)" in d.log()
    assert d.status()["state_dir"] == d.state_dir
  finally:
    finish_test_daemon(d)
