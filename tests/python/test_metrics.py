"""Visibility (docs/operator-guide.md "Watching it"): per-target launch/error counts and latency
percentiles in `kregctl status`/`show`, `kregctl sessions`, and the opt-in
Prometheus endpoint (`--metrics-listen`). Every test runs the real kregd,
its executors and real JAX processes; the scrape is read by a strict
Prometheus text-format parser written here."""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import kernels_util as ku
from kregd_proc import start_test_daemon, finish_test_daemon, Daemon, daemon_binary
from kregd_proc import run_kregctl as kregctl

CLIENT = str(pathlib.Path(__file__).resolve().parent / "metrics_client.py")


# -- a strict parser of the Prometheus text format (0.0.4) -------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


class PromError(AssertionError):
  pass


def _labels(text: str, lineno: int) -> dict[str, str]:
  """Parses `a="x",b="y"` (the inside of the braces), escapes \\\\ \\" \\n."""
  out: dict[str, str] = {}
  i = 0
  while i < len(text):
    m = re.match(LABEL, text[i:])
    if not m:
      raise PromError(f"line {lineno}: bad label name at {text[i:]!r}")
    name = m.group(0)
    i += len(name)
    if text[i:i + 2] != '="':
      raise PromError(f"line {lineno}: expected =\" after {name}")
    i += 2
    value = []
    while True:
      if i >= len(text):
        raise PromError(f"line {lineno}: unterminated value of {name}")
      c = text[i]
      if c == "\\":
        nxt = text[i + 1:i + 2]
        if nxt not in ("\\", '"', "n"):
          raise PromError(f"line {lineno}: bad escape \\{nxt} in {name}")
        value.append("\n" if nxt == "n" else nxt)
        i += 2
      elif c == '"':
        i += 1
        break
      elif c == "\n":
        raise PromError(f"line {lineno}: raw newline in {name}")
      else:
        value.append(c)
        i += 1
    if name in out:
      raise PromError(f"line {lineno}: label {name} twice")
    out[name] = "".join(value)
    if i < len(text):
      if text[i] != ",":
        raise PromError(f"line {lineno}: expected , after {name}")
      i += 1
  return out


def _value(text: str, lineno: int) -> float:
  if text in ("+Inf", "-Inf", "NaN"):
    return float(text.replace("Inf", "inf").replace("NaN", "nan"))
  if not re.fullmatch(r"[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?)",
                      text):
    raise PromError(f"line {lineno}: bad value {text!r}")
  return float(text)


def parse_prometheus(text: str) -> dict:
  """{family: {"type", "help", "samples": [(name, labels, value)]}}; raises
  PromError on anything the format does not allow (or that it allows but a
  well-behaved exporter never writes: blank lines, a family split in two,
  a sample before its TYPE, duplicate series, a broken histogram)."""
  if not text.endswith("\n"):
    raise PromError("the exposition does not end with a newline")
  families: dict[str, dict] = {}
  current = None
  closed: set[str] = set()
  seen: set[tuple] = set()
  for lineno, line in enumerate(text[:-1].split("\n"), 1):
    if not line:
      raise PromError(f"line {lineno}: blank line")
    if line.startswith("#"):
      m = re.fullmatch(rf"# (HELP|TYPE) ({NAME}) (.*)", line)
      if not m:
        raise PromError(f"line {lineno}: bad comment {line!r}")
      kind, name, rest = m.groups()
      if name in closed:
        raise PromError(f"line {lineno}: family {name} split")
      if current is not None and current != name:
        closed.add(current)
      current = name
      fam = families.setdefault(name, {"type": None, "help": None,
                                       "samples": []})
      if kind == "HELP":
        if fam["help"] is not None:
          raise PromError(f"line {lineno}: second HELP for {name}")
        if re.search(r"\\[^\\n]", rest):
          raise PromError(f"line {lineno}: bad escape in HELP of {name}")
        fam["help"] = rest
      else:
        if fam["type"] is not None or fam["samples"]:
          raise PromError(f"line {lineno}: TYPE of {name} late or twice")
        if rest not in TYPES:
          raise PromError(f"line {lineno}: unknown type {rest!r}")
        fam["type"] = rest
      continue
    m = re.fullmatch(rf"({NAME})(?:\{{(.*)\}})? (\S+)(?: (-?\d+))?", line)
    if not m:
      raise PromError(f"line {lineno}: bad sample {line!r}")
    name, label_text, value_text, _ = m.groups()
    labels = _labels(label_text or "", lineno)
    value = _value(value_text, lineno)
    fam_name = current
    fam = families.get(fam_name) if fam_name else None
    if fam is None or fam["type"] is None:
      raise PromError(f"line {lineno}: sample {name} before its TYPE")
    allowed = {fam_name}
    if fam["type"] == "histogram":
      allowed = {fam_name + s for s in ("_bucket", "_sum", "_count")}
    if name not in allowed:
      raise PromError(f"line {lineno}: {name} outside its family")
    key = (name, tuple(sorted(labels.items())))
    if key in seen:
      raise PromError(f"line {lineno}: duplicate series {key}")
    seen.add(key)
    if fam["type"] == "counter" and not value >= 0:
      raise PromError(f"line {lineno}: negative counter {name}")
    fam["samples"].append((name, labels, value))
  for fam_name, fam in families.items():
    if fam["type"] == "histogram":
      _check_histogram(fam_name, fam["samples"])
  return families


def _check_histogram(fam_name: str, samples) -> None:
  series: dict[tuple, dict] = {}
  for name, labels, value in samples:
    rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
    s = series.setdefault(rest, {"buckets": [], "sum": None, "count": None})
    if name.endswith("_bucket"):
      if "le" not in labels:
        raise PromError(f"{fam_name}: bucket without le")
      s["buckets"].append((_value(labels["le"], 0), value))
    elif name.endswith("_sum"):
      s["sum"] = value
    else:
      s["count"] = value
  for rest, s in series.items():
    b = s["buckets"]
    if not b or b[-1][0] != math.inf:
      raise PromError(f"{fam_name}{rest}: no +Inf bucket last")
    if any(b[i][0] >= b[i + 1][0] for i in range(len(b) - 1)):
      raise PromError(f"{fam_name}{rest}: le not increasing")
    if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
      raise PromError(f"{fam_name}{rest}: buckets not cumulative")
    if s["count"] != b[-1][1] or s["sum"] is None:
      raise PromError(f"{fam_name}{rest}: _count/_sum missing or != +Inf")


def sample(families: dict, name: str, **labels) -> float:
  fam = name
  for suffix in ("_bucket", "_sum", "_count"):
    if name.endswith(suffix) and name[:-len(suffix)] in families:
      fam = name[:-len(suffix)]
  for n, l, v in families[fam]["samples"]:
    if n == name and all(l.get(k) == str(v2) for k, v2 in labels.items()):
      return v
  raise KeyError(f"{name}{labels}")


def test_the_parser_itself_refuses_what_the_format_forbids():
  good = ('# HELP a_total x\n# TYPE a_total counter\n'
          'a_total{t="q\\"\\\\\\n"} 1\n')
  assert sample(parse_prometheus(good), "a_total", t='q"\\\n') == 1
  for bad in ("a 1\n",  # no TYPE
              good.rstrip("\n"),  # no final newline
              good + "\n",  # blank line
              good + 'a_total{t="q\\"\\\\\\n"} 2\n',  # duplicate series
              good.replace("\\\\", "\\x"),  # bad escape
              good.replace(" 1\n", " one\n"),
              good.replace("counter", "countr"),
              good + "# TYPE b gauge\nb 1\na_total{t=\"z\"} 1\n",  # split
              "# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
              "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"):
    with pytest.raises(PromError):
      parse_prometheus(bad)


# -- helpers -----------------------------------------------------------------


def http(address: str, request: bytes, timeout: float = 10) -> tuple:
  """Sends raw `request` to unix:/path or HOST:PORT; (status, headers,
  body) of the reply (the server closes after one)."""
  # kregd opens its metrics listener just after the session socket the
  # test harness waits for: a connection refused right after the start is
  # tried again (an ASan kregd took long enough for it to matter).
  deadline = time.monotonic() + timeout
  while True:
    try:
      if address.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
          s.connect(address[5:])
        except OSError:
          s.close()
          raise
      else:
        host, port = address.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=timeout)
      break
    except (ConnectionRefusedError, FileNotFoundError):
      if time.monotonic() > deadline:
        raise
      time.sleep(0.05)
  with s:
    try:
      s.sendall(request)
    except OSError:
      pass  # refused before it read everything: the reply is still there
    data = b""
    while True:
      try:
        chunk = s.recv(65536)
      except ConnectionResetError:
        break
      if not chunk:
        break
      data += chunk
  head, _, body = data.partition(b"\r\n\r\n")
  lines = head.decode("latin-1").split("\r\n")
  status = int(lines[0].split(" ")[1])
  headers = {k.lower(): v.strip() for k, _, v in
             (line.partition(":") for line in lines[1:])}
  return status, headers, body


def scrape(address: str) -> dict:
  status, headers, body = http(address, b"GET /metrics HTTP/1.1\r\n"
                               b"Host: kregd\r\n\r\n")
  assert status == 200, body
  assert headers["content-type"].startswith("text/plain; version=0.0.4")
  assert int(headers["content-length"]) == len(body)
  return parse_prometheus(body.decode("utf-8"))


def run_client(d, prefix, n_scale, n_fail, *extra, timeout=180):
  p = subprocess.run([sys.executable, CLIENT, prefix, str(n_scale),
                      str(n_fail), *extra], env=d.env(), capture_output=True,
                     text=True, timeout=timeout)
  assert p.returncode == 0, p.stdout + p.stderr
  return json.loads(p.stdout.strip().splitlines()[-1])


def make_daemon(*extra):
  return start_test_daemon("kreg-m-", extra)


def finish(d):
  finish_test_daemon(d)


def wait_until(cond, timeout, what):
  deadline = time.monotonic() + timeout
  while not cond():
    if time.monotonic() > deadline:
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.1)


def show_stats(d, name):
  (entry,) = json.loads(kregctl(d, "show", name, "--json").stdout)
  return entry["stats"]


def check_ordered(stats):
  lat = stats["latency_us"]
  assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"], lat
  assert lat["count"] == stats["launches"]


@pytest.fixture(scope="module")
def mdaemon():
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-m-", dir="/tmp"))
  metrics = f"unix:{root}/metrics.sock"
  # One executor per uid: the counting tests follow one executor (the
  # default, client, gives each process its own).
  d = Daemon(root, [os.path.realpath(ku.kernels_dir())],
             ["--metrics-listen", metrics, "--isolation", "uid"])
  try:
    d.start()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  d.metrics = metrics
  yield d
  finish(d)


# -- counts, errors, percentiles ---------------------------------------------


def test_counts_are_exact_and_survive_the_executor(mdaemon):
  d = mdaemon
  out = run_client(d, "cnt", 37, 5)
  assert (out["scale_ok"], out["fail_errors"]) == (37, 5)

  scale = show_stats(d, "cnt.scale")
  assert (scale["launches"], scale["errors"]) == (37, 0)
  check_ordered(scale)
  fail = show_stats(d, "cnt.fail")
  assert (fail["launches"], fail["errors"]) == (5, 5)
  check_ordered(fail)

  status = json.loads(kregctl(d, "status", "--json").stdout)
  by_name = {t["target_name"]: t for t in status["target_stats"]}
  assert by_name["cnt.scale"]["launches"] == 37
  assert by_name["cnt.fail"]["errors"] == 5
  text = kregctl(d, "status").stdout
  assert re.search(r"^cnt\.scale\s+cpu\s+37\s+0\s", text, re.M), text
  assert "calls: launches 37, errors 0, latency p50" in kregctl(
      d, "show", "cnt.scale").stdout

  m = scrape(d.metrics)
  lbl = {"target": "cnt.scale", "platform": "cpu"}
  assert sample(m, "kregd_target_launches_total", **lbl) == 37
  # A target never replaced counts under generation 1 (docs/replace.md).
  assert sample(m, "kregd_target_launches_total", generation="1", **lbl) == 37
  assert sample(m, "kregd_target_launch_errors_total", **lbl) == 0
  assert sample(m, "kregd_target_launch_errors_total", target="cnt.fail",
                platform="cpu") == 5
  assert sample(m, "kregd_target_launch_duration_seconds_count", **lbl) == 37
  assert sample(m, "kregd_target_launch_duration_seconds_bucket", le="+Inf",
                **lbl) == 37
  assert sample(m, "kregd_target_launch_duration_seconds_sum", **lbl) > 0

  # The executor dies (no call in flight): its counts are kept by kregd.
  (ex,) = status["executors"]
  started = status["executors_started"]
  os.kill(ex["pid"], signal.SIGKILL)
  wait_until(lambda: not json.loads(
      kregctl(d, "status", "--json").stdout)["executors"], 20,
             "the killed executor to be reaped")
  assert show_stats(d, "cnt.scale")["launches"] == 37
  assert sample(scrape(d.metrics), "kregd_target_launches_total", **lbl) == 37

  run_client(d, "cnt", 10, 0)
  status = json.loads(kregctl(d, "status", "--json").stdout)
  assert status["executors_started"] == started + 1
  scale = show_stats(d, "cnt.scale")
  assert (scale["launches"], scale["errors"]) == (47, 0)
  check_ordered(scale)
  m = scrape(d.metrics)
  assert sample(m, "kregd_target_launches_total", **lbl) == 47
  assert sample(m, "kregd_executors_started_total") >= 2
  assert sample(m, "kregd_targets", platform="cpu") >= 2
  assert sample(m, "kregd_store_bytes") > 0
  assert sample(m, "kregd_modules") >= 1
  assert sample(m, "kregd_build_info", version=status["version"]) == 1


def test_a_target_never_called_has_no_stats(mdaemon):
  kregctl(mdaemon, "register", "idle.target", "--module",
          str(ku.kernel_path(ku.DEMO)), "--function", "Scale")
  stats = show_stats(mdaemon, "idle.target")
  assert stats["launches"] == 0 and stats["latency_us"]["count"] == 0
  m = scrape(mdaemon.metrics)
  with pytest.raises(KeyError):
    sample(m, "kregd_target_launches_total", target="idle.target")


def test_process_metrics_follow_the_prometheus_conventions(mdaemon):
  # The standard process_* families of Prometheus' client libraries, for
  # kregd itself, from /proc.
  m = scrape(mdaemon.metrics)
  types = {"process_start_time_seconds": "gauge",
           "process_cpu_seconds_total": "counter",
           "process_resident_memory_bytes": "gauge",
           "process_virtual_memory_bytes": "gauge",
           "process_open_fds": "gauge", "process_max_fds": "gauge"}
  for name, kind in types.items():
    assert m[name]["type"] == kind, name
    assert [(n, l) for n, l, _ in m[name]["samples"]] == [(name, {})], name
  started = sample(m, "process_start_time_seconds")
  uptime = sample(m, "kregd_uptime_seconds")
  assert abs(time.time() - uptime - started) < 5, (started, uptime)
  assert sample(m, "process_cpu_seconds_total") >= 0
  rss = sample(m, "process_resident_memory_bytes")
  assert rss > 1 << 20
  assert sample(m, "process_virtual_memory_bytes") >= rss
  fds = sample(m, "process_open_fds")
  actual = len(os.listdir(f"/proc/{mdaemon.pid}/fd"))
  assert 3 <= fds and abs(fds - actual) <= 4, (fds, actual)
  limits = pathlib.Path(f"/proc/{mdaemon.pid}/limits").read_text()
  soft = re.search(r"^Max open files\s+(\d+)", limits, re.M).group(1)
  assert sample(m, "process_max_fds") == int(soft)
  # CPU time is a counter: it never goes down.
  assert sample(scrape(mdaemon.metrics), "process_cpu_seconds_total") >= (
      sample(m, "process_cpu_seconds_total"))


def test_registration_outcomes_are_counted_by_outcome_and_reason(mdaemon):
  def counts():
    m = scrape(mdaemon.metrics)
    assert m["kregd_registrations_total"]["type"] == "counter"
    reasons = {l["reason"] for _, l, _ in
               m["kregd_registrations_refused_total"]["samples"]}
    assert reasons == {"conflict", "invalid", "quota", "permission",
                       "unavailable", "other"}
    return {"created": sample(m, "kregd_registrations_total",
                              outcome="created"),
            "noop": sample(m, "kregd_registrations_total", outcome="noop"),
            **{r: sample(m, "kregd_registrations_refused_total", reason=r)
               for r in reasons}}

  def register(name, module, check=True):
    return kregctl(mdaemon, "register", name, "--module",
                   str(ku.kernel_path(module)), "--function", "Scale",
                   check=check)

  before = counts()
  register("outcome.one", ku.DEMO)
  after_create = counts()
  assert after_create == {**before, "created": before["created"] + 1}
  register("outcome.one", ku.DEMO)
  after_noop = counts()
  assert after_noop == {**after_create, "noop": after_create["noop"] + 1}
  assert register("outcome.one", ku.DEMO_V2, check=False).returncode == 3
  after_conflict = counts()
  assert after_conflict == {**after_noop,
                            "conflict": after_noop["conflict"] + 1}
  assert register("9bad name", ku.DEMO, check=False).returncode == 2
  assert counts() == {**after_conflict,
                      "invalid": after_conflict["invalid"] + 1}


def test_a_retired_target_is_scraped_once_more_with_its_final_values(
    mdaemon):
  d = mdaemon
  out = run_client(d, "gone", 4, 2)
  assert (out["scale_ok"], out["fail_errors"]) == (4, 2)
  lbl = {"target": "gone.fail", "platform": "cpu"}
  assert sample(scrape(d.metrics), "kregd_target_launches_total", **lbl) == 2
  kregctl(d, "retire", "gone.fail", "--platform", "cpu")
  # The first scrape after the retirement shows the final values ...
  m = scrape(d.metrics)
  assert sample(m, "kregd_target_launches_total", **lbl) == 2
  assert sample(m, "kregd_target_launch_errors_total", **lbl) == 2
  assert sample(m, "kregd_target_launch_duration_seconds_count", **lbl) == 2
  # ... later ones no longer have the series; the live target keeps its.
  m = scrape(d.metrics)
  for name in ("kregd_target_launches_total",
               "kregd_target_launch_errors_total",
               "kregd_target_launch_duration_seconds_count"):
    with pytest.raises(KeyError):
      sample(m, name, **lbl)
  assert sample(m, "kregd_target_launches_total", target="gone.scale",
                platform="cpu") == 4


# -- kregctl sessions --------------------------------------------------------


def test_sessions_lists_a_connected_jax_process_until_it_exits(mdaemon):
  d = mdaemon
  stop = d.root / "ses.stop"
  p = subprocess.Popen([sys.executable, CLIENT, "ses", "3", "2", str(stop)],
                       env=d.env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  try:
    line = p.stdout.readline()
    assert line, p.stderr.read()
    pid = json.loads(line)["pid"]
    rows = [s for s in json.loads(kregctl(d, "sessions", "--json").stdout)
            if s["pid"] == pid]
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["uid"] == os.getuid()
    assert {(t["target_name"], t["platform"]) for t in row["targets"]} == {
        ("ses.scale", "cpu"), ("ses.fail", "cpu")}
    assert row["launches"] == 5
    assert abs(row["since_us"] / 1e6 - time.time()) < 300
    assert row["executor_pid"] > 0
    assert row["arena_bytes"] > 0
    text = kregctl(d, "sessions").stdout
    assert text.startswith("PID ")
    assert re.search(rf"^{pid}\s+{os.getuid()}\s", text, re.M), text
    assert "ses.fail(cpu),ses.scale(cpu)" in text
    m = scrape(d.metrics)
    assert sample(m, "kregd_sessions_by_uid", uid=os.getuid()) >= 1
    assert sample(m, "kregd_shared_arena_bytes") >= row["arena_bytes"]
  finally:
    stop.touch()
    p.wait(timeout=60)
  wait_until(lambda: pid not in [
      s["pid"] for s in json.loads(kregctl(d, "sessions", "--json").stdout)],
             20, f"pid {pid} to leave `kregctl sessions`")


# -- the HTTP endpoint -------------------------------------------------------


def test_metrics_endpoint_answers_only_get_metrics(mdaemon):
  a = mdaemon.metrics
  status, _, body = http(a, b"GET /nope HTTP/1.1\r\n\r\n")
  assert status == 404 and b"only /metrics" in body
  status, headers, _ = http(a, b"POST /metrics HTTP/1.1\r\n"
                            b"Content-Length: 0\r\n\r\n")
  assert status == 405 and headers["allow"] == "GET, HEAD"
  status, headers, body = http(a, b"HEAD /metrics HTTP/1.1\r\n\r\n")
  assert status == 200 and body == b"" and int(headers["content-length"]) > 0
  status, _, body = http(a, b"GET /metrics HTTP/1.1\r\nX-Big: " +
                         b"a" * 100000 + b"\r\n\r\n")
  assert status == 431 and b"longer than 8192 bytes" in body
  status, _, _ = http(a, b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03")
  assert status == 400
  status, _, _ = http(a, b"GET /metrics HTTP/2.0\r\n\r\n")
  assert status == 505
  # Still serving after all that.
  assert "kregd_uptime_seconds" in scrape(a)


def free_port() -> int:
  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
  s.close()
  return port


def test_metrics_over_loopback_tcp():
  port = free_port()
  d = make_daemon("--metrics-listen", f"127.0.0.1:{port}")
  try:
    m = scrape(f"127.0.0.1:{port}")
    # (Daemon.start's readiness probe may hold a session for a moment.)
    assert sample(m, "kregd_sessions") >= 0
    assert sample(m, "kregd_executors", isolation="client") >= 0
    assert f"metrics: serving http://127.0.0.1:{port}/metrics" in d.log()
  finally:
    finish(d)


def listening_inet_sockets(pid: int) -> list:
  """TCP sockets in LISTEN state among `pid`'s descriptors."""
  inodes = set()
  for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
    try:
      target = os.readlink(fd)
    except OSError:
      continue
    if target.startswith("socket:["):
      inodes.add(target[8:-1])
  found = []
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in pathlib.Path(table).read_text().splitlines()[1:]:
      f = line.split()
      if f[3] == "0A" and f[9] in inodes:
        found.append((table, f[1]))
  return found


def test_metrics_are_off_by_default():
  d = make_daemon()
  try:
    assert listening_inet_sockets(d.pid) == []
    assert "metrics:" not in d.log()
    assert not list(d.root.glob("*metrics*"))
  finally:
    finish(d)


def test_metrics_listen_port_in_use_stops_the_start(tmp_path):
  blocker = socket.socket()
  blocker.bind(("127.0.0.1", 0))
  blocker.listen(1)
  port = blocker.getsockname()[1]
  try:
    p = start_error(tmp_path, "--metrics-listen", f"127.0.0.1:{port}")
    assert p.returncode == 1
    assert f"cannot bind metrics_listen 127.0.0.1:{port}" in p.stderr
  finally:
    blocker.close()


def start_error(tmp_path, *args):
  if not daemon_binary().is_file():
    pytest.skip("kregd not built")
  return subprocess.run(
      [str(daemon_binary()), "--socket", str(tmp_path / "k.sock"),
       "--state-dir", str(tmp_path / "state"), *args],
      capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("value,why", [
    ("127.0.0.1:0", "is not a number from 1 to 65535"),
    ("127.0.0.1:65536", "is not a number from 1 to 65535"),
    ("127.0.0.1:metrics", "\"metrics\" is not a number"),
    ("localhost:9464", "host names are not resolved"),
    ("garbage", "no :PORT"),
    ("unix:relative.sock", "must be absolute"),
    ("0.0.0.0:9464", "metrics_allow_remote = true"),
    ("[::]:9464", "not a loopback address"),
])
def test_bad_metrics_listen_is_refused_at_start(tmp_path, value, why):
  p = start_error(tmp_path, "--metrics-listen", value)
  assert p.returncode == 2, p.stderr
  assert f'metrics_listen "{value}"' in p.stderr
  assert why in p.stderr
  assert "(--metrics-listen)" in p.stderr
  assert not (tmp_path / "k.sock").exists()


def test_bad_metrics_config_keys_are_refused(tmp_path):
  cfg = tmp_path / "kregd.toml"
  cfg.write_text('metrics_listen = "10.1.2.3:9464"\n')
  p = start_error(tmp_path, "--config", str(cfg))
  assert p.returncode == 2
  assert 'metrics_listen "10.1.2.3:9464"' in p.stderr
  assert "(config file)" in p.stderr
  cfg.write_text('metrics_allow_remote = "yes"\n')
  p = start_error(tmp_path, "--config", str(cfg))
  assert p.returncode == 2
  assert 'key "metrics_allow_remote" must be true or false' in p.stderr


def test_remote_metrics_address_with_the_opt_in(tmp_path):
  port = free_port()
  d = make_daemon("--metrics-listen", f"0.0.0.0:{port}",
                  "--metrics-allow-remote")
  try:
    assert "kregd_uptime_seconds" in scrape(f"127.0.0.1:{port}")
  finally:
    finish(d)


# -- a hostile executor ------------------------------------------------------


def test_an_executor_scribbling_its_status_page_cannot_credit_others():
  """A kernel fills its executor's status page with 0xff. kregd keeps
  serving; the garbage can only land on targets that executor's own
  sessions resolved (here: the scribbling one), never on another client's
  (isolation client: a second executor), and what kregd reports stays
  well-formed (errors <= launches, ordered percentiles, a scrape that
  parses)."""
  d = make_daemon("--isolation", "client", "--metrics-listen",
                  "unix:/tmp/kreg-m-scribble-%d.sock" % os.getpid())
  d.metrics = "unix:/tmp/kreg-m-scribble-%d.sock" % os.getpid()
  try:
    good = run_client(d, "good", 20, 0)
    assert good["scale_ok"] == 20
    evil = run_client(d, "evil", 0, 0, "-", "scribble")
    assert evil["scribbled"][0] > 0 and evil["scribbled"][1] >= 1, evil
    stats = show_stats(d, "good.scale")
    assert (stats["launches"], stats["errors"]) == (20, 0)
    assert show_stats(d, "evil.scale")["launches"] == 0
    assert show_stats(d, "evil.fail")["launches"] == 0
    status = json.loads(kregctl(d, "status", "--json").stdout)
    for t in status["target_stats"]:
      assert t["errors"] <= t["launches"], t
      lat = t["latency_us"]
      assert lat["p50"] <= lat["p90"] <= lat["p99"], t
    assert {t["target_name"] for t in status["target_stats"]} <= {
        "good.scale", "evil.scribble"}
    m = scrape(d.metrics)
    assert sample(m, "kregd_target_launches_total", target="good.scale",
                  platform="cpu") == 20
    kregctl(d, "sessions", "--json")
    # kregd itself is fine and still registers and serves calls.
    assert run_client(d, "after", 2, 0)["scale_ok"] == 2
    assert show_stats(d, "after.scale")["launches"] == 2
  finally:
    finish(d)
