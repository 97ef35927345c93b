"""The gRPC socket's limits (operator guide, "The gRPC socket"):
one uid's idle connections are capped and closed after
grpc_first_message_timeout_s, so they cannot exhaust kregd's descriptors,
flood its log or lock out other users; an upload stream is bounded by
grpc_stream_timeout_s, by what its header announced and by its uid's share
of upload bytes in flight (max_upload_bytes_per_uid). Tests start a real
kregd and talk to its socket as clients do (raw connections, grpcio with hand-encoded
kreg.v1.RegisterTargetChunk messages, kregctl as uid 65534)."""

import os
import pathlib
import resource
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import pytest

import kernels_util as ku
from kregd_proc import start_test_daemon, finish_test_daemon, kregctl_binary
from proto_wire import bfield, varint

grpc = pytest.importorskip("grpc")

NOBODY = 65534
REGISTER = "/kreg.v1.Registry/RegisterTarget"


def header_chunk(name, upload_size, func=b"Scale"):
  """A RegisterTargetChunk carrying the header of an upload."""
  module = varint(2 << 3) + varint(upload_size)  # ModuleSource.upload_size
  header = (bfield(1, name) + bfield(2, func) + bfield(3, b"cpu") +
            bfield(6, module))
  return bfield(1, header)


def bytes_chunk(data):
  return bfield(2, data)


def register_stub(channel):
  return channel.stream_unary(REGISTER, request_serializer=lambda b: b,
                              response_deserializer=lambda b: b)


def daemon_with(prefix, toml, extra_args=()):
  """A kregd started with `toml` as its config file."""
  root = pathlib.Path(tempfile.mkdtemp(prefix=prefix + "cfg-", dir="/tmp"))
  (root / "kregd.toml").write_text(toml)
  d = start_test_daemon(prefix, ["--config", str(root / "kregd.toml"),
                                 *extra_args])
  d.config_dir = root
  return d


def finish(d):
  finish_test_daemon(d)
  shutil.rmtree(d.config_dir, ignore_errors=True)


def fd_count(pid):
  return len(os.listdir(f"/proc/{pid}/fd"))


def log_lines(d):
  return len(d.log(tail=None).splitlines())


@pytest.fixture
def nobody_kregctl():
  """kregctl and libdemo.so where uid 65534 may run and read them."""
  if os.geteuid() != 0:
    pytest.skip("needs root: a client runs as uid 65534")
  kregctl = kregctl_binary()
  if kregctl is None:
    pytest.skip("kregctl not built")
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-grpcl-", dir="/var/tmp"))
  os.chmod(root, 0o755)
  shutil.copy(kregctl, root / "kregctl")
  shutil.copy(ku.kernel_path(ku.DEMO), root / ku.DEMO)
  for f in ("kregctl", ku.DEMO):
    os.chmod(root / f, 0o755)
  yield root
  shutil.rmtree(root, ignore_errors=True)


def register_as_nobody(d, tools, name, timeout=60):
  """`kregctl register NAME` of libdemo.so as uid 65534 (an upload over
  the gRPC socket); returns (completed process, seconds it took)."""
  os.chmod(d.root, 0o711)  # uid 65534 reaches the socket (0660, group 0)
  start = time.monotonic()
  # setpriv switches the uid after exec, so Python starts the child with
  # vfork: no fork handlers run. With user= it forks, and grpcio's fork
  # handler can crash the child (SIGSEGV before exec) while this process
  # has gRPC calls in flight, as the tests holding streams do.
  p = subprocess.run(
      ["setpriv", f"--reuid={NOBODY}", "--regid=0", "--clear-groups",
       str(tools / "kregctl"), "--socket", d.socket, "register", name,
       "--module", str(tools / ku.DEMO), "--function", "Scale",
       "--platform", "cpu"],
      capture_output=True, text=True, timeout=timeout, cwd="/")
  return p, time.monotonic() - start


def open_idle(path, n):
  """`n` connections to `path` that send nothing (non-blocking connects: a
  full backlog refuses instead of blocking)."""
  socks = []
  for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
      s.connect(path)
    except (BlockingIOError, ConnectionRefusedError):
      s.close()
      continue
    socks.append(s)
  return socks


def closed_by_kregd(s, timeout):
  """Whether kregd closes `s` within `timeout` seconds."""
  s.setblocking(True)
  s.settimeout(timeout)
  try:
    return s.recv(1) == b""
  except ConnectionResetError:
    return True
  except socket.timeout:
    return False


PER_UID = 8


def test_one_uids_idle_connections_are_capped_and_closed(nobody_kregctl):
  d = daemon_with("kreg-grpcc-",
                  f"max_grpc_connections_per_uid = {PER_UID}\n"
                  "grpc_first_message_timeout_s = 15.0\n")
  socks = []
  try:
    fds_before, lines_before = fd_count(d.pid), log_lines(d)
    socks = open_idle(d.socket, PER_UID + 200)
    assert len(socks) > PER_UID + 100
    # kregd keeps PER_UID of them and closes the others at once (its
    # deadline for the kept ones is 15 s away).
    deadline = time.monotonic() + 30
    while True:
      kept = [s for s in socks if not closed_by_kregd(s, 0.01)]
      if len(kept) <= PER_UID or time.monotonic() > deadline:
        break
    assert 0 < len(kept) <= PER_UID, d.log()
    # Each connection kregd holds costs it one descriptor (two once gRPC
    # has it).
    assert fd_count(d.pid) <= fds_before + 2 * PER_UID + 8, d.log()
    # Another uid registers promptly.
    p, took = register_as_nobody(d, nobody_kregctl, "grpcl.other")
    assert p.returncode == 0, p.stdout + p.stderr + d.log()
    assert took < 30, took
    log = d.log(tail=None)
    assert (f"uid 0 holds {PER_UID} gRPC connections already; 1 more would "
            f"exceed its limit of {PER_UID} (max_grpc_connections_per_uid)"
            ) in log
    # Rate-limited: 20 lines per uid per 10 s, not one per connection.
    assert log_lines(d) - lines_before < 60, log[-4000:]
    # The connections kregd kept are closed at the first-message deadline.
    # (Their log lines may be among those the limiter drops.)
    for s in kept:
      assert closed_by_kregd(s, 30), d.log()
    # And their slots are free again.
    again = open_idle(d.socket, PER_UID)
    socks += again
    assert not any(closed_by_kregd(s, 0.5) for s in again), d.log()
  finally:
    for s in socks:
      s.close()
    finish(d)


def test_connections_over_the_daemon_wide_limit_are_refused():
  d = daemon_with("kreg-grpct-", "max_grpc_connections = 4\n")
  socks = []
  try:
    socks = open_idle(d.socket, 10)
    assert sum(closed_by_kregd(s, 10) for s in socks[4:]) == 6, d.log()
    assert not any(closed_by_kregd(s, 0.01) for s in socks[:4])
    assert ("refusing a gRPC connection of pid "
            f"{os.getpid()}: kregd holds 4 gRPC connections already (limit 4, "
            "max_grpc_connections)") in d.log(tail=None)
  finally:
    for s in socks:
      s.close()
    finish(d)


def test_a_connection_that_sends_nothing_is_closed_at_its_deadline():
  d = daemon_with("kreg-grpcf-", "grpc_first_message_timeout_s = 2.0\n")
  try:
    (s,) = open_idle(d.socket, 1)
    with s:
      assert closed_by_kregd(s, 30), d.log()
    assert ("closing a gRPC connection of uid 0 (pid "
            f"{os.getpid()}) that sent nothing within 2000 ms "
            "(grpc_first_message_timeout_s)") in d.log(tail=None)
  finally:
    finish(d)


def test_running_out_of_descriptors_pauses_accepting(nobody_kregctl):
  metrics = tempfile.mktemp(prefix="kreg-grpce-metrics-", dir="/tmp")
  d = daemon_with("kreg-grpce-", "grpc_first_message_timeout_s = 3.0\n",
                  ["--metrics-listen", f"unix:{metrics}"])
  socks = []
  try:
    # The start-up check's connection to the session socket is served,
    # closed and reaped (within a second) first.
    deadline = time.monotonic() + 30
    while (f"session 1 (pid {os.getpid()}) closed" not in d.log(tail=None) and
           time.monotonic() < deadline):
      time.sleep(0.05)
    time.sleep(1.5)
    # A descriptor limit at kregd's lowest free descriptor number: every
    # accept fails with EMFILE, on each of kregd's listeners, until the
    # limit is raised.
    _, hard = resource.prlimit(d.pid, resource.RLIMIT_NOFILE)
    used = {int(fd) for fd in os.listdir(f"/proc/{d.pid}/fd")}
    lowest_free = min(set(range(len(used) + 1)) - used)
    resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (lowest_free, hard))
    lines_before = log_lines(d)
    socks = (open_idle(d.socket, 300) + open_idle(d.session_socket, 1) +
             open_idle(metrics, 1))
    deadline = time.monotonic() + 30
    while (d.log(tail=None).count("accept: Too many open files") < 3 and
           time.monotonic() < deadline):
      time.sleep(0.1)
    time.sleep(1)  # kregd keeps trying
    log = d.log(tail=None)
    # No spinning: one line per 10 s and socket, not one per failed accept.
    assert log_lines(d) - lines_before < 40, log[-4000:]
    for what in ("gRPC", "session", "metrics"):
      assert (f"{what} socket: accept: Too many open files; accepting again "
              "in 100 ms (raise kregd's descriptor limit, LimitNOFILE") in log, (
                  log[-4000:])
    # A limit just above what kregd has open: the idle connections take
    # the rest, are closed at their deadline, and then kregd accepts
    # again: another uid registers.
    limit = fd_count(d.pid) + 16
    resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (limit, hard))
    time.sleep(1)
    for s in socks:
      s.close()
    socks = []
    time.sleep(4)
    p, _ = register_as_nobody(d, nobody_kregctl, "grpcl.after")
    assert p.returncode == 0, p.stdout + p.stderr + d.log()
  finally:
    for s in socks:
      s.close()
    finish(d)


@pytest.fixture
def upload_daemon():
  d = daemon_with("kreg-grpcu-", "grpc_stream_timeout_s = 3.0\n")
  try:
    yield d
  finally:
    finish(d)


def test_a_connection_that_stalls_after_its_first_bytes_is_closed(
    upload_daemon):
  # Half a client preface: gRPC has the connection, and no call starts on
  # it; kregd closes it after grpc_stream_timeout_s (3 s) without a call.
  (s,) = open_idle(upload_daemon.socket, 1)
  with s:
    s.setblocking(True)
    s.sendall(b"PRI * HTTP/2.0")
    s.settimeout(60)
    start = time.monotonic()
    while s.recv(4096):  # kregd's SETTINGS and GOAWAY, then EOF
      pass
    assert time.monotonic() - start < 50


def test_a_stream_carrying_more_than_announced_is_refused_at_once(
    upload_daemon):
  sent = []

  def chunks():
    yield header_chunk(b"grpcl.over", 1000)
    for _ in range(256):  # 256 MiB, if kregd read them all
      sent.append(1)
      yield bytes_chunk(b"\0" * (1 << 20))

  with grpc.insecure_channel(f"unix:{upload_daemon.socket}") as ch:
    with pytest.raises(grpc.RpcError) as err:
      register_stub(ch)(chunks(), timeout=120)
  assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  assert ("the stream carries more than the 1000 module bytes its header "
          "announced (module.upload_size); chunk 1 brings it to 1048576"
          ) in err.value.details()
  # Refused on the first chunk: the client sent little more than what the
  # transport buffers, not the 256 MiB.
  assert len(sent) <= 32, len(sent)


def test_stalled_uploads_end_at_their_deadline_and_free_the_budget():
  module = ku.kernel_path(ku.DEMO).read_bytes()
  # Twice max_module_bytes is a uid's share by default: two stalled uploads
  # announcing max_module_bytes each hold all of it.
  d = daemon_with("kreg-grpcs-", "grpc_stream_timeout_s = 10.0\n",
                  ["--max-module-bytes", str(len(module))])
  release = threading.Event()

  def stalled(name):
    yield header_chunk(name, len(module))
    yield bytes_chunk(module[:4096])
    release.wait(120)

  try:
    with grpc.insecure_channel(f"unix:{d.socket}") as ch:
      register = register_stub(ch)
      held = [register.future(stalled(f"grpcl.stall{i}".encode()))
              for i in range(2)]
      time.sleep(2)  # both headers are in

      def upload(name):
        return register(iter([header_chunk(name, len(module)),
                              bytes_chunk(module)]), timeout=60)

      with pytest.raises(grpc.RpcError) as err:
        upload(b"grpcl.third")
      assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
      assert (f"kregd refused a module upload of {len(module)} bytes "
              "(counted by its announced size, sparse or not): uid 0 holds "
              f"{2 * len(module)} bytes of module uploads in flight already; "
              f"{len(module)} bytes more would exceed its limit of "
              f"{2 * len(module)} bytes (max_upload_bytes_per_uid)"
              ) in err.value.details()
      # kregd cancels the stalled streams (grpc_stream_timeout_s = 10) and
      # gives their bytes back: the upload goes through.
      for f in held:
        with pytest.raises(grpc.RpcError):
          f.result(timeout=60)
      upload(b"grpcl.third")
      release.set()
  finally:
    release.set()
    finish(d)
