"""Integration tests for kregd's systemd integration (DESIGN.md §5).

Covers daemon/systemd/kregd.{service,socket} (systemd-analyze verify and
security) and the daemon's side of the protocols those units rely on:
socket activation (LISTEN_FDS, fd 3 gRPC, fd 4 session) through
systemd-socket-activate, and sd_notify (READY=1 after the journal is replayed
and the socket listens, WATCHDOG=1, STOPPING=1) through a NOTIFY_SOCKET this
test owns. No running systemd is needed.

Run: .venv/bin/python -m pytest tests/integration/test_systemd.py
Binaries come from $KREG_BIN_DIR (default <repo>/bazel-bin); build them with
  bazel build //daemon/kregd:kregd //client/kregctl //kernels/cpu:all
"""

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT_DIR = REPO / "daemon" / "systemd"
BIN_DIR = Path(os.environ.get("KREG_BIN_DIR", REPO / "bazel-bin"))
KREGD = BIN_DIR / "daemon" / "kregd" / "kregd"
KREGD_PROBE = BIN_DIR / "daemon" / "executor" / "kregd-probe"
KREGCTL = BIN_DIR / "client" / "kregctl" / "kregctl"
DEMO_MODULE = BIN_DIR / "kernels" / "cpu" / "libdemo.so"

INSTALLED_KREGD = "/usr/local/bin/kregd"
DEFAULT_SOCKET = "/run/kregd/kregd.sock"
DEFAULT_STATE = "/var/lib/kregd"

START_TIMEOUT = 30.0  # seconds for kregd to become ready
STOP_TIMEOUT = 15.0  # seconds for kregd to exit after SIGTERM
CMD_TIMEOUT = 30.0  # seconds for any helper command


# --------------------------------------------------------------------------
# helpers


def need_binaries(*paths):
    for p in paths:
        assert Path(p).is_file() and os.access(p, os.X_OK), (
            f"{p} is missing; build it first: bazel build //daemon/kregd:kregd "
            "//client/kregctl //kernels/cpu:all (or set KREG_BIN_DIR)")


def need_tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian package: systemd)")
    return path


def clean_env(**extra):
    """The test's environment minus anything systemd-ish it may have inherited."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("LISTEN_", "NOTIFY_SOCKET", "WATCHDOG_",
                             "XDG_RUNTIME_DIR", "XDG_STATE_HOME"))
    }
    env.update(extra)
    return env


@pytest.fixture
def tmp():
    # Short and under /tmp: sun_path holds 107 bytes, and pytest's tmp_path
    # plus "k.sock.session" can get close to that.
    d = Path(tempfile.mkdtemp(prefix="kregsd-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Daemon:
    """A child process in its own session, logging to a file; always reaped."""

    def __init__(self, argv, log, env):
        self.log = Path(log)
        self._log_f = open(self.log, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=self._log_f,
                                     stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    @property
    def pid(self):
        return self.proc.pid

    def log_text(self):
        return self.log.read_text(errors="replace")

    def terminate(self, timeout=STOP_TIMEOUT):
        """SIGTERM and wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT)
        self._log_f.close()


def kregctl(sock, *args, timeout=CMD_TIMEOUT):
    return subprocess.run([str(KREGCTL), "--socket", str(sock), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=clean_env())


def connectable(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(2.0)
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def wait_for(pred, timeout, what, daemon=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if daemon is not None and daemon.proc.poll() is not None:
            pytest.fail(f"kregd exited ({daemon.proc.returncode}) while "
                        f"waiting for {what}:\n{daemon.log_text()}")
        time.sleep(0.02)
    msg = f"timed out after {timeout}s waiting for {what}"
    if daemon is not None:
        msg += f"\n{daemon.log_text()}"
    pytest.fail(msg)


def parse_kv(text):
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class NotifySocket:
    """A NOTIFY_SOCKET owned by the test; records (time, sender pid, fields)."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        # Like systemd: ask for the sender's credentials with each datagram.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.messages = []  # (monotonic time, pid, {key: value})

    def close(self):
        self.sock.close()

    def _recv(self, timeout):
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data, anc, _, _ = self.sock.recvmsg(
                4096, socket.CMSG_SPACE(struct.calcsize("3i")))
        except (socket.timeout, BlockingIOError):
            return None
        pid = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, _uid, _gid = struct.unpack("3i", payload[:12])
        fields = {}
        for line in data.decode(errors="replace").split("\n"):
            if "=" in line:
                k, v = line.split("=", 1)
                fields[k] = v
        msg = (time.monotonic(), pid, fields)
        self.messages.append(msg)
        return msg

    def wait_for(self, key, value, timeout, daemon=None):
        """Returns the first message (already received or new) with key=value."""
        for m in self.messages:
            if m[2].get(key) == value:
                return m
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            m = self._recv(min(left, 0.2))
            if m is not None and m[2].get(key) == value:
                return m
            if m is None and daemon is not None and \
                    daemon.proc.poll() is not None:
                break
        got = [m[2] for m in self.messages]
        msg = f"no {key}={value} within {timeout}s; got {got}"
        if daemon is not None:
            msg += f"\nexit status {daemon.proc.poll()}\n{daemon.log_text()}"
        pytest.fail(msg)

    def drain(self, seconds):
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._recv(left)

    def count(self, key, value, pid=None):
        return sum(1 for _, p, f in self.messages
                   if f.get(key) == value and (pid is None or p == pid))


def read_unit(path):
    """[(section, key, value)] in file order; repeated keys kept (unlike
    configparser), comments and blank lines dropped."""
    entries, section = [], None
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not a key=value line: {raw!r}"
        entries.append((section, key.strip(), value.strip()))
    return entries


def values(entries, section, key):
    return [v for s, k, v in entries if s == section and k == key]


def register_demo(sock, name):
    r = kregctl(sock, "register", name, "--module", str(DEMO_MODULE),
                "--function", "Scale")
    assert r.returncode == 0, f"register failed: {r.stdout}{r.stderr}"


# --------------------------------------------------------------------------
# (a) the unit files


def verify_copy(tmp):
    """Copies the units into tmp with ExecStart= pointing at the built kregd
    (the installed /usr/local/bin/kregd need not exist here)."""
    need_binaries(KREGD)
    real = os.path.realpath(KREGD)
    text = (UNIT_DIR / "kregd.service").read_text()
    text, n = re.subn(r"^ExecStart=" + re.escape(INSTALLED_KREGD) + r"(?=\s|$)",
                      "ExecStart=" + real, text, flags=re.M)
    assert n == 1, "kregd.service must have exactly one ExecStart=" + \
        INSTALLED_KREGD
    (tmp / "kregd.service").write_text(text)
    shutil.copy(UNIT_DIR / "kregd.socket", tmp / "kregd.socket")
    return tmp / "kregd.service", tmp / "kregd.socket"


INSTALLED_MPS_CONTROL = "/usr/bin/nvidia-cuda-mps-control"


def verify_mps_copy(tmp):
    """Copies nvidia-mps.service into tmp with nvidia-cuda-mps-control
    replaced by a stand-in script (this machine has no NVIDIA driver)."""
    fake = tmp / "nvidia-cuda-mps-control"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    text = (UNIT_DIR / "nvidia-mps.service").read_text()
    assert text.count(INSTALLED_MPS_CONTROL) == 3, \
        "nvidia-mps.service runs nvidia-cuda-mps-control in ExecStart= and " \
        "ExecStop=, and needs it (ConditionPathExists=)"
    (tmp / "nvidia-mps.service").write_text(
        text.replace(INSTALLED_MPS_CONTROL, str(fake)))
    return tmp / "nvidia-mps.service"


def test_units_pass_systemd_analyze_verify(tmp):
    tool = need_tool("systemd-analyze")
    service, sock = verify_copy(tmp)
    mps = verify_mps_copy(tmp)
    r = subprocess.run([tool, "verify", "--man=no", str(sock), str(service),
                        str(mps)],
                       capture_output=True, text=True, timeout=120, cwd=tmp,
                       env=clean_env(SYSTEMD_LOG_COLOR="0"))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # Any diagnostic about our units (unknown keys, bad values, missing
    # binaries, ordering cycles) is a failure even though verify exits 0 for
    # many of them.
    ours = [l for l in out.splitlines() if "kregd" in l or "nvidia-mps" in l]
    assert ours == [], "\n".join(ours)


def test_verify_catches_a_broken_mps_unit(tmp):
    """Guards the test above for nvidia-mps.service."""
    tool = need_tool("systemd-analyze")
    mps = verify_mps_copy(tmp)
    mps.write_text(mps.read_text().replace(
        "[Service]\n", "[Service]\nNoSuchMpsKey=1\n"))
    r = subprocess.run([tool, "verify", "--man=no", str(mps)],
                       capture_output=True, text=True, timeout=120, cwd=tmp,
                       env=clean_env(SYSTEMD_LOG_COLOR="0"))
    assert "NoSuchMpsKey" in r.stdout + r.stderr


def test_mps_unit_is_skipped_where_mps_is_not_installed():
    # kregd.service Wants= it: on a host without the NVIDIA driver's MPS
    # control daemon the unit is skipped by its condition, not failed.
    text = (UNIT_DIR / "nvidia-mps.service").read_text()
    unit = text[text.index("[Unit]"):text.index("[Service]")]
    assert "\nConditionPathExists=" + INSTALLED_MPS_CONTROL + "\n" in unit


def test_mps_unit_contents():
    """nvidia-mps.service runs the MPS control daemon in the foreground with
    the pipe directory kregd.service gives kregd (not under /tmp: kregd has
    PrivateTmp=yes), and kregd.service wants it and starts after it."""
    e = read_unit(UNIT_DIR / "nvidia-mps.service")
    one = lambda sec, key: values(e, sec, key)  # noqa: E731
    assert one("Service", "ExecStart") == [INSTALLED_MPS_CONTROL + " -f"]
    assert one("Service", "ExecStop") == [
        "/bin/sh -c 'echo quit | " + INSTALLED_MPS_CONTROL + "'"]
    env = one("Service", "Environment")
    assert "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps" in env
    assert "/run/" + one("Service", "RuntimeDirectory")[0] == "/run/nvidia-mps"
    assert any("/run/nvidia-mps/control" in v
               for v in one("Service", "ExecStartPost"))
    assert one("Install", "WantedBy") == ["multi-user.target"]
    keys = {k for _, k, _ in e}
    # It must not change the GPU's settings.
    assert not any("nvidia-smi" in v for _, _, v in e)
    assert "User" not in keys  # the control daemon starts servers per uid
    k = read_unit(UNIT_DIR / "kregd.service")
    assert "nvidia-mps.service" in " ".join(values(k, "Unit", "Wants"))
    assert "nvidia-mps.service" in " ".join(values(k, "Unit", "After"))
    assert "nvidia-mps.service" not in " ".join(values(k, "Unit", "Requires"))
    assert "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps" in \
        values(k, "Service", "Environment")


def test_verify_catches_a_broken_unit(tmp):
    """Guards the test above: verify does report problems in our units."""
    tool = need_tool("systemd-analyze")
    service, sock = verify_copy(tmp)
    service.write_text(service.read_text().replace(
        "[Service]\n", "[Service]\nNoSuchKey=1\n"))
    r = subprocess.run([tool, "verify", "--man=no", str(sock), str(service)],
                       capture_output=True, text=True, timeout=120, cwd=tmp,
                       env=clean_env(SYSTEMD_LOG_COLOR="0"))
    assert "NoSuchKey" in r.stdout + r.stderr


def test_service_unit_contents():
    e = read_unit(UNIT_DIR / "kregd.service")
    one = lambda sec, key: values(e, sec, key)  # noqa: E731
    assert one("Service", "Type") == ["notify"]
    assert one("Service", "ExecStart") == [INSTALLED_KREGD]
    assert one("Service", "WatchdogSec") == ["30s"]
    assert one("Service", "Restart") == ["on-failure"]
    assert one("Service", "StateDirectory") == ["kregd"]
    assert one("Service", "StateDirectoryMode") == ["0700"]
    assert one("Service", "RuntimeDirectory") == ["kregd"]
    # Otherwise stopping the service deletes /run/kregd and with it the socket
    # files that kregd.socket keeps listening on.
    assert one("Service", "RuntimeDirectoryPreserve") == ["yes"]
    assert one("Service", "NoNewPrivileges") == ["yes"]
    assert one("Service", "ProtectSystem") == ["strict"]
    assert one("Service", "PrivateTmp") == ["yes"]
    assert "kregd.socket" in " ".join(one("Unit", "Requires"))
    assert "kregd.socket" in " ".join(one("Unit", "After"))
    assert one("Install", "WantedBy") == ["multi-user.target"]
    assert "kregd.socket" in " ".join(one("Install", "Also"))
    keys = {k for _, k, _ in e}
    # CUDA and JIT need W+X memory and /dev/nvidia*; ProtectClock= implies a
    # DeviceAllow= that closes the device policy on older systemd.
    for banned in ("MemoryDenyWriteExecute", "PrivateDevices", "DevicePolicy",
                   "DeviceAllow", "ProtectClock", "NoExecPaths", "User",
                   "DynamicUser"):
        assert banned not in keys, f"{banned}= breaks kregd (see comments)"


def test_socket_unit_contents():
    e = read_unit(UNIT_DIR / "kregd.socket")
    # Order is the fd order: fd 3 gRPC, fd 4 session.
    assert values(e, "Socket", "ListenStream") == [
        DEFAULT_SOCKET, DEFAULT_SOCKET + ".session"]
    assert values(e, "Socket", "SocketMode") == ["0660"]
    assert values(e, "Socket", "Service") == ["kregd.service"]
    assert values(e, "Socket", "Accept") in ([], ["no"], ["false"])
    assert values(e, "Install", "WantedBy") == ["sockets.target"]


def test_units_match_kregd_embedded_defaults():
    """The units run kregd without flags, so its defaults must be theirs."""
    need_binaries(KREGD)
    r = subprocess.run([str(KREGD), "--help"], capture_output=True, text=True,
                       timeout=CMD_TIMEOUT, env=clean_env())
    assert r.returncode == 0, r.stderr
    assert re.search(r"--socket\s+TEXT=" + re.escape(DEFAULT_SOCKET) + r"\s",
                     r.stdout), r.stdout
    assert re.search(r"--state-dir\s+TEXT=" + re.escape(DEFAULT_STATE) +
                     r"\s", r.stdout), r.stdout
    service = read_unit(UNIT_DIR / "kregd.service")
    assert "/var/lib/" + values(service, "Service", "StateDirectory")[0] == \
        DEFAULT_STATE
    assert "/run/" + values(service, "Service", "RuntimeDirectory")[0] == \
        os.path.dirname(DEFAULT_SOCKET)


def test_service_hardening_exposure(tmp):
    tool = need_tool("systemd-analyze")
    service, _ = verify_copy(tmp)
    r = subprocess.run([tool, "security", "--offline=true", "--no-pager",
                        "--threshold=60", str(service)],
                       capture_output=True, text=True, timeout=120, cwd=tmp,
                       env=clean_env(SYSTEMD_LOG_COLOR="0"))
    if "--offline" in r.stderr and "unrecognized" in r.stderr:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    out = r.stdout + r.stderr
    m = re.search(r"Overall exposure level for kregd\.service: ([0-9.]+)", out)
    assert m, out
    # 10 is an unsandboxed root service; the unit scores about 4.7.
    assert float(m.group(1)) <= 6.0, out
    assert r.returncode == 0, out


# --------------------------------------------------------------------------
# (b) socket activation


def start_socket_activated(tmp, *kregd_args):
    tool = need_tool("systemd-socket-activate")
    need_binaries(KREGD, KREGD_PROBE, KREGCTL)
    sock, session = tmp / "k.sock", tmp / "k.sock.session"
    # Without --accept, systemd-socket-activate binds the sockets, waits for
    # the first connection and then execs kregd in its own process with
    # LISTEN_FDS=2 (fd 3 = first -l, fd 4 = second -l), as systemd does.
    d = Daemon([tool, "-l", str(sock), "-l", str(session), "--",
                str(KREGD), "--state-dir", str(tmp / "state"), *kregd_args],
               tmp / "kregd.log", clean_env())
    wait_for(lambda: sock.exists() and session.exists(), START_TIMEOUT,
             "systemd-socket-activate to bind the sockets", d)
    return d, sock, session


def test_socket_activation_serves_inherited_fd(tmp):
    d, sock, session = start_socket_activated(
        tmp, "--socket", str(tmp / "own.sock"))
    try:
        # The first connection makes systemd-socket-activate exec kregd; the
        # request waits in the listen backlog meanwhile.
        r = kregctl(sock, "health")
        assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{d.log_text()}"
        assert r.stdout.strip() == "SERVING"

        r = kregctl(sock, "status")
        assert r.returncode == 0, r.stdout + r.stderr
        st = parse_kv(r.stdout)
        assert st.get("state_dir") == str(tmp / "state"), r.stdout

        # It served the inherited sockets instead of binding its own; the
        # supervision socket (re-adoption, DESIGN §12) is bound next to the
        # inherited session socket, not next to the configured path.
        assert not (tmp / "own.sock").exists()
        assert not (tmp / "own.sock.session").exists()
        assert not (tmp / "own.sock.session.exec").exists()
        wait_for(lambda: (tmp / "k.sock.session.exec").exists(), 10.0,
                 "the supervision socket beside the inherited one", d)
        assert "inherited from systemd" in d.log_text()
        # Same process (exec): LISTEN_PID matched.
        comm = Path(f"/proc/{d.pid}/comm").read_text().strip()
        assert comm == "kregd"
        # Both inherited sockets are still open in kregd as fds 3 and 4.
        for fd in (3, 4):
            assert os.readlink(f"/proc/{d.pid}/fd/{fd}").startswith("socket:")

        # fd 4 is the session socket and is served: a connection to it
        # becomes a session that status counts.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(5.0)
            c.connect(str(session))

            def one_session():
                r = kregctl(sock, "status")
                return r.returncode == 0 and \
                    parse_kv(r.stdout).get("sessions") == "1"
            wait_for(one_session, 10.0,
                     "status to count the session on the inherited fd 4", d)

        # Registration works over the activated socket and survives restarts
        # through the state directory.
        register_demo(sock, "sd_demo")
        r = kregctl(sock, "list")
        assert r.returncode == 0 and "sd_demo" in r.stdout, r.stdout + r.stderr

        # On SIGTERM kregd exits 0 and leaves the socket files alone: they
        # belong to whoever passed them (kregd.socket).
        assert d.terminate() == 0, d.log_text()
        assert sock.exists() and session.exists()
    finally:
        d.close()


def test_socket_activation_restart_keeps_targets(tmp):
    """What Restart=on-failure relies on: a second activation on the same
    state directory replays the journal."""
    d, sock, _ = start_socket_activated(tmp)
    try:
        register_demo(sock, "sd_persist")
        assert d.terminate() == 0, d.log_text()
    finally:
        d.close()
    for p in (tmp / "k.sock", tmp / "k.sock.session"):
        p.unlink()
    d, sock, _ = start_socket_activated(tmp)
    try:
        r = kregctl(sock, "list")
        assert r.returncode == 0, r.stdout + r.stderr + d.log_text()
        assert "sd_persist" in r.stdout
    finally:
        d.close()


def test_status_reports_the_inherited_socket(tmp):
    d, sock, _ = start_socket_activated(tmp)
    try:
        r = kregctl(sock, "status")
        assert r.returncode == 0, r.stdout + r.stderr
        assert parse_kv(r.stdout).get("socket") == str(sock), r.stdout
    finally:
        d.close()


# --------------------------------------------------------------------------
# (c) sd_notify: readiness, watchdog, stopping


def start_notified(tmp, notify, extra_env=None, shell_prefix=""):
    """Starts kregd (own socket, no activation) with NOTIFY_SOCKET=notify.

    `shell_prefix` runs in a `sh -c` that then execs kregd, so it can set
    WATCHDOG_PID=$$ (the pid kregd will have)."""
    sock = tmp / "k.sock"
    env = clean_env(NOTIFY_SOCKET=notify.path, **(extra_env or {}))
    args = [str(KREGD), "--socket", str(sock), "--state-dir",
            str(tmp / "state")]
    if shell_prefix:
        argv = ["/bin/sh", "-c", shell_prefix + ' exec "$@"', "sh", *args]
    else:
        argv = args
    return Daemon(argv, tmp / f"kregd-{len(list(tmp.glob('kregd-*')))}.log",
                  env), sock


def test_ready_after_replay_and_listen_then_stopping(tmp):
    need_binaries(KREGD, KREGD_PROBE, KREGCTL, DEMO_MODULE)
    notify = NotifySocket(tmp / "notify")
    try:
        # First run: populate the state directory with two targets.
        d, sock = start_notified(tmp, notify)
        try:
            notify.wait_for("READY", "1", START_TIMEOUT, d)
            register_demo(sock, "ready_a")
            register_demo(sock, "ready_b")
            assert d.terminate() == 0, d.log_text()
        finally:
            d.close()
        notify.messages.clear()

        # Second run: READY=1 must mean "journal replayed and socket listens".
        d, sock = start_notified(tmp, notify)
        try:
            _, pid, fields = notify.wait_for("READY", "1", START_TIMEOUT, d)
            # Checked before anything else, as close to READY=1 as possible.
            assert connectable(sock), "READY=1 sent before the socket listens"
            assert connectable(tmp / "k.sock.session"), \
                "READY=1 sent before the session socket listens"
            log_at_ready = d.log_text()
            assert pid == d.pid, "READY=1 must come from the main pid"
            assert re.search(r"journal replayed: 2 records, 2 loaded",
                             log_at_ready), log_at_ready
            # STATUS= rides along with READY=1.
            assert "STATUS" in fields, fields

            r = kregctl(sock, "health", timeout=10)
            assert r.returncode == 0 and r.stdout.strip() == "SERVING", \
                r.stdout + r.stderr
            r = kregctl(sock, "list", timeout=10)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "ready_a" in r.stdout and "ready_b" in r.stdout, r.stdout
            assert notify.count("READY", "1") == 1

            # No watchdog configured: no WATCHDOG=1.
            notify.drain(0.5)
            assert notify.count("WATCHDOG", "1") == 0

            d.proc.send_signal(signal.SIGTERM)
            notify.wait_for("STOPPING", "1", STOP_TIMEOUT, d)
            assert d.proc.wait(timeout=STOP_TIMEOUT) == 0, d.log_text()
            assert not sock.exists(), "kregd left its socket file behind"
            assert not (tmp / "k.sock.session").exists(), \
                "kregd left its session socket file behind"
        finally:
            d.close()
    finally:
        notify.close()


def test_watchdog_pings(tmp):
    need_binaries(KREGD, KREGD_PROBE)
    notify = NotifySocket(tmp / "notify")
    try:
        d, sock = start_notified(
            tmp, notify, {"WATCHDOG_USEC": "200000"},
            shell_prefix="WATCHDOG_PID=$$; export WATCHDOG_PID;")
        try:
            t_ready, _, _ = notify.wait_for("READY", "1", START_TIMEOUT, d)
            notify.drain(1.5)
            pings = [t for t, p, f in notify.messages
                     if f.get("WATCHDOG") == "1" and p == d.pid]
            # Every WatchdogSec/2 = 100 ms: ~15 in 1.5 s. Allow a loaded box.
            assert len(pings) >= 5, notify.messages
            gaps = [b - a for a, b in zip(pings, pings[1:])]
            # Periodic, not a burst (generous for a loaded machine).
            assert max(gaps) < 0.5, f"watchdog pings stalled: {gaps}"
            assert all(p == d.pid for _, p, f in notify.messages), \
                "notifications must come from the main pid"
            d.proc.send_signal(signal.SIGTERM)
            notify.wait_for("STOPPING", "1", STOP_TIMEOUT, d)
            assert d.proc.wait(timeout=STOP_TIMEOUT) == 0, d.log_text()
            assert not sock.exists()
        finally:
            d.close()
    finally:
        notify.close()


def test_watchdog_ignored_for_another_pid(tmp):
    """WATCHDOG_PID names another process (e.g. inherited from a parent
    service): the watchdog is not ours, so no WATCHDOG=1."""
    need_binaries(KREGD, KREGD_PROBE)
    notify = NotifySocket(tmp / "notify")
    try:
        d, _ = start_notified(tmp, notify, {"WATCHDOG_USEC": "200000",
                                            "WATCHDOG_PID": "1"})
        try:
            notify.wait_for("READY", "1", START_TIMEOUT, d)
            notify.drain(0.8)
            assert notify.count("WATCHDOG", "1") == 0, notify.messages
        finally:
            d.close()
    finally:
        notify.close()
