"""Module uploads over the session socket's control connections
(module.upload_size and an fd, DESIGN §3) are refused by kregd's size and
quota checks before a byte is read (DESIGN §6, hostile clients): the
precheck the gRPC path runs on its upload header, with the announced size,
so the refusal carries the gRPC path's message. The client runs as uid
65534 (quotas do not apply to root) and speaks the session protocol itself,
so it can attach what no real client would: a pipe (which cannot be read
with pread: had kregd read it, the error would say so) or an unsealed
memfd shorter than announced (refused for its seals before it is read)."""

import json
import os
import shutil
import subprocess

import pytest

import kernels_util as ku
from kregd_proc import start_test_daemon, finish_test_daemon, kregctl_binary

MAX_MODULE = 2 << 20
STORE_QUOTA = 64 << 10
NOBODY = 65534

# The client: a few protobuf fields encoded by hand (no generated code), one
# session (or more: a case's "session"), one JSON line per hello and request:
# {"code": N, "message": text, "fds": [[inode, size] of each attached fd]}.
CLIENT = r'''
import json, os, socket, struct, sys

def varint(n):
  out = b""
  while True:
    b = n & 0x7F
    n >>= 7
    if n:
      out += bytes([b | 0x80])
    else:
      return out + bytes([b])

def vfield(num, v):
  return varint(num << 3) + varint(v)

def bfield(num, b):
  return varint((num << 3) | 2) + varint(len(b)) + b

def fields(buf):
  i, out = 0, {}
  while i < len(buf):
    key, i = read_varint(buf, i)
    num, kind = key >> 3, key & 7
    if kind == 0:
      v, i = read_varint(buf, i)
    elif kind == 2:
      n, i = read_varint(buf, i)
      v, i = buf[i:i + n], i + n
    elif kind == 1:
      v, i = buf[i:i + 8], i + 8
    else:
      v, i = buf[i:i + 4], i + 4
    out[num] = v
  return out

def read_varint(buf, i):
  n = shift = 0
  while True:
    b = buf[i]
    i += 1
    n |= (b & 0x7F) << shift
    shift += 7
    if not b & 0x80:
      return n, i

# Descriptors kregd attached to responses (BindLocal's memfd): kept open.
RECEIVED = []

def recv_exact(s, n):
  data = b""
  while len(data) < n:
    chunk, fds, _, _ = socket.recv_fds(s, n - len(data), 4)
    RECEIVED.extend(fds)
    if not chunk:
      raise EOFError("kregd closed the session")
    data += chunk
  return data

def call(s, rid, body_num, body, fds=()):
  payload = vfield(1, rid) + bfield(body_num, body)
  frame = struct.pack("<I", len(payload)) + payload
  socket.send_fds(s, [frame], list(fds))
  got = len(RECEIVED)
  (n,) = struct.unpack("<I", recv_exact(s, 4))
  resp = fields(recv_exact(s, n))
  status = fields(resp.get(2, b""))
  return {"code": status.get(1, 0),
          "message": status.get(2, b"").decode(errors="replace"),
          "has_body": any(k >= 3 for k in resp),
          "body": max([k for k in resp if k >= 3], default=0),
          # (inode, size) of each descriptor attached to the response.
          "fds": [[os.fstat(fd).st_ino, os.fstat(fd).st_size]
                  for fd in RECEIVED[got:]]}

def register(name, platform=b"cpu", size=None, path=None, func=b"Scale"):
  # A RegisterTargetHeader (registration.proto); module = ModuleSource.
  module = b""
  if path is not None:
    module += bfield(1, path)
  if size is not None:
    module += vfield(2, size)
  msg = bfield(1, name) + bfield(2, func) + bfield(3, platform)
  return 11, msg + (bfield(6, module) if module else b"")

def connect(hello):
  s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  s.connect(sock_path)
  if hello:
    # Session protocol 2.0 (common/session_protocol.h).
    hello = vfield(1, 2) + vfield(2, 0) + vfield(3, os.getpid())
    print(json.dumps(call(s, 1, 2, hello)), flush=True)
  return s

sock_path, cases = sys.argv[1], json.loads(sys.argv[2])
# A case's "session" (default 0) picks or opens a connection: registrations
# and listings go on a control connection (no Hello), binds on a session
# (Hello first, its answer printed); a "close" case ends both.
conns = {}
rid = 2
for case in cases:
  k = case.get("session", 0)
  if case["kind"] == "close":
    for key in [(k, True), (k, False)]:
      if key in conns:
        conns.pop(key).close()
    continue
  control = case["kind"] in ("register", "list")
  if (k, control) not in conns:
    conns[(k, control)] = connect(hello=not control)
  s = conns[(k, control)]
  fds, keep = [], []
  if case.get("attach") == "pipe":
    r, w = os.pipe()
    os.write(w, b"\x7fELF never read")
    fds, keep = [r], [r, w]
  elif case.get("attach") == "memfd":
    fd = os.memfd_create("short-module")
    os.write(fd, b"\x7fELF" + b"\0" * 96)
    fds, keep = [fd], [fd]
  elif case.get("attach") in ("sparse", "module"):
    # Sealed as kregd wants: "sparse" is an ELF header and holes up to
    # "size" (free for the sender), "module" the bytes of "module".
    import fcntl
    fd = os.memfd_create("module", os.MFD_ALLOW_SEALING)
    if case["attach"] == "sparse":
      os.write(fd, b"\x7fELF")
      os.ftruncate(fd, case["size"])
    else:
      with open(case["module"], "rb") as f:
        os.write(fd, f.read())
      case["size"] = os.fstat(fd).st_size
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE |
                fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    fds, keep = [fd], [fd]
  if case["kind"] == "list":
    out = call(s, rid, 4, b"")
  elif case["kind"] == "bind":
    out = call(s, rid, 10, bfield(1, case["name"].encode()) + bfield(2, b"cpu"))
  else:
    out = call(s, rid, *register(
        case["name"].encode(), size=case.get("size"),
        path=case["path"].encode() if "path" in case else None), fds)
  for fd in keep:
    os.close(fd)
  print(json.dumps(out), flush=True)
  rid += 1
'''


def run_client(d, cases, user=NOBODY):
  """Runs CLIENT against `d` as `user` (None: this process's uid); its
  answers, one dict per hello and request."""
  who = {} if user is None else {"user": user, "group": 0, "extra_groups": []}
  p = subprocess.run(
      ["/usr/bin/python3", "-I", "-c", CLIENT, d.session_socket,
       json.dumps(cases)],
      capture_output=True, text=True, timeout=120, **who)
  assert p.returncode == 0, p.stdout + p.stderr + d.log()
  return [json.loads(line) for line in p.stdout.splitlines()]


@pytest.fixture
def daemon():
  if os.geteuid() != 0:
    pytest.skip("needs root: the client runs as uid 65534 (quotas do not "
                "apply to root)")
  if not os.path.exists("/usr/bin/python3"):
    pytest.skip("needs /usr/bin/python3 (a Python uid 65534 may run)")
  d = start_test_daemon("kreg-upl-", [
      "--max-module-bytes", str(MAX_MODULE),
      "--max-store-bytes-per-uid", str(STORE_QUOTA)])
  os.chmod(d.root, 0o711)  # uid 65534 reaches the socket (0660, group 0)
  try:
    yield d
  finally:
    finish_test_daemon(d)


def test_fd_upload_over_limits_is_refused_before_it_is_read(daemon):
  big = MAX_MODULE + (1 << 20)
  over_quota = 1 << 20
  too_big, pipe_quota, memfd_quota, listed = run_client(daemon, [
      {"kind": "register", "name": "lim.big", "size": big,
       "attach": "pipe"},
      {"kind": "register", "name": "lim.quota", "size": over_quota,
       "attach": "pipe"},
      {"kind": "register", "name": "lim.quota", "size": over_quota,
       "attach": "memfd"},
      {"kind": "list"},
  ])
  # max_module_bytes: the gRPC path's message (Registrar::PrecheckUpload).
  assert too_big["code"] == 3, too_big  # INVALID_ARGUMENT
  assert too_big["message"] == (
      f"uploaded module is {big} bytes; the limit is {MAX_MODULE} "
      "(max_module_bytes)"), too_big
  for refused in (pipe_quota, memfd_quota):
    assert refused["code"] == 8, refused  # RESOURCE_EXHAUSTED
    msg = refused["message"]
    assert msg.startswith("cannot register "), msg
    assert (f"its {over_quota}-byte module would bring uid {NOBODY}'s "
            f"module store use to {over_quota} bytes (now 0); the limit per "
            f"uid is {STORE_QUOTA} bytes (max_store_bytes_per_uid)") in msg
    # Never read: reading a pipe fails, a short memfd says what it holds.
    assert "cannot be read" not in msg and "holds" not in msg, msg
  # The gRPC path refuses the same upload with the same message.
  kregctl = kregctl_binary()
  if kregctl is not None:
    exe = daemon.root / "kregctl"
    shutil.copy(kregctl, exe)
    os.chmod(exe, 0o755)
    module = daemon.root / "big.so"
    module.write_bytes(b"\x7fELF" + b"\0" * (over_quota - 4))
    os.chmod(module, 0o644)
    p = subprocess.run([str(exe), "--socket", daemon.socket, "register",
                        "lim.quota", "--module", str(module), "--function",
                        "Scale"], capture_output=True, text=True, timeout=60,
                       user=NOBODY, group=0, extra_groups=[])
    assert p.returncode != 0
    assert pipe_quota["message"] in p.stdout + p.stderr, p.stdout + p.stderr
  # The connection carries on; so do kregd and other clients.
  assert listed["code"] == 0, listed
  assert listed["body"] == 13, listed  # ListTargetsResponse
  assert daemon.running()
  demo = os.path.realpath(ku.kernel_path(ku.DEMO))
  (created,) = run_client(daemon, [
      {"kind": "register", "name": "lim.ok", "path": demo}], user=0)
  assert created["code"] == 0 and created["has_body"], created
  assert created["body"] == 12, created  # RegisterTargetResponse
  if kregctl is not None:
    listing = subprocess.run(
        [str(kregctl), "--socket", daemon.socket, "list", "--json"],
        capture_output=True, text=True, timeout=60, check=True)
    names = [t["target_name"] for t in json.loads(listing.stdout)]
    assert names == ["lim.ok"], names


def test_fd_upload_within_limits_must_be_a_sealed_memfd(daemon):
  # The precheck lets an acceptable size through; the memfd, unsealed and
  # shorter than announced, is then refused for its seals, unread.
  (short,) = run_client(daemon, [
      {"kind": "register", "name": "lim.short", "size": 4096,
       "attach": "memfd"}])
  assert short["code"] == 3, short
  assert short["message"] == (
      "the module memfd attached to the upload is not sealed against "
      "writing, shrinking and growing (seals 0x1); seal it (F_SEAL_WRITE | "
      "F_SEAL_SHRINK | F_SEAL_GROW) before sending it"), short
