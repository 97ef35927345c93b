"""The Debian package (tools/build_deb.sh): its control data and contents,
its maintainer scripts, and the installed kregd started the way its unit
starts it, registering and running a kernel with the installed kregctl and
kregd-exec. systemd does not run here: the installed unit is checked with
`systemd-analyze verify` and its ExecStart= is run directly."""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest

from kregd_proc import Daemon, finish_test_daemon

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("KREG_BIN_DIR", REPO / "bazel-bin"))
BINARIES = ("kregd", "kregd-exec", "kregd-probe", "kregd-compile", "kregctl")
VERSION = re.search(r'kKregVersion\[\] = "([^"]+)"',
                    (REPO / "common/version.h").read_text()).group(1)


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
  if shutil.which("dpkg-deb") is None:
    pytest.skip("dpkg-deb is not installed")
  for b in ("daemon/kregd/kregd", "daemon/executor/kregd-probe",
            "daemon/executor/kregd-exec", "daemon/kregd_compile/kregd-compile",
            "client/kregctl/kregctl"):
    if not (BIN_DIR / b).is_file():
      pytest.skip(f"{BIN_DIR / b} not built")
  out = tmp_path_factory.mktemp("dist")
  r = subprocess.run(["bash", str(REPO / "tools/build_deb.sh"), str(BIN_DIR),
                      str(out)], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  path = pathlib.Path(r.stdout.strip().splitlines()[-1])
  arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                        text=True, check=True).stdout.strip()
  assert path == out / f"kregd_{VERSION}_{arch}.deb"
  return path


@pytest.fixture(scope="module")
def installed(deb, tmp_path_factory):
  """The package unpacked into a scratch root (what dpkg -i puts on disk)."""
  root = tmp_path_factory.mktemp("root")
  subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True,
                 timeout=120)
  return root


def field(deb: pathlib.Path, name: str) -> str:
  return subprocess.run(["dpkg-deb", "--field", str(deb), name],
                        capture_output=True, text=True, check=True).stdout.strip()


def unit_exec_start(root: pathlib.Path) -> list[str]:
  unit = (root / "lib/systemd/system/kregd.service").read_text()
  m = re.search(r"^ExecStart=(.+)$", unit, re.M)
  assert m, "kregd.service has no ExecStart="
  return shlex.split(m.group(1))


def test_deb_control_fields(deb):
  assert field(deb, "Package") == "kregd"
  assert field(deb, "Version") == VERSION
  assert field(deb, "Maintainer")
  info = subprocess.run(["dpkg-deb", "--info", str(deb)], capture_output=True,
                        text=True, check=True).stdout
  for script in ("postinst", "prerm", "postrm"):
    assert re.search(rf"^\s+\d+ bytes,\s+\d+ lines\s+\*\s+{script}\s", info,
                     re.M), (script, info)


def test_deb_depends_covers_every_shared_library(deb, installed):
  depends = {d.split()[0] for d in field(deb, "Depends").split(", ")}
  assert "libc6" in depends and "libstdc++6" in depends
  # The libraries each binary links directly (DT_NEEDED; ldd also lists
  # what those pull in, which their own packages depend on).
  libs = set()
  for b in BINARIES:
    path = str(installed / "usr/bin" / b)
    out = subprocess.run(["ldd", path], capture_output=True, text=True,
                         check=True).stdout
    assert "not found" not in out, out
    where = dict(re.findall(r"^\s*(\S+) => (/\S+)", out, re.M))
    # The dynamic loader: ldd lists it by its path only (libc6 has it).
    where.update({pathlib.Path(p).name: p
                  for p in re.findall(r"^\s*(/\S+) \(", out, re.M)})
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True,
                             text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", dynamic)
    assert needed
    libs |= {where[n] for n in needed}
  for lib in sorted(libs):
    owner = subprocess.run(["dpkg", "-S", os.path.realpath(lib)],
                           capture_output=True, text=True)
    if owner.returncode != 0:
      owner = subprocess.run(["dpkg", "-S", lib], capture_output=True,
                             text=True)
    assert owner.returncode == 0, f"no package owns {lib}"
    package = owner.stdout.split(":")[0]
    # A shlibs file may name a virtual package the owner provides
    # (libspdlog1.10 provides libspdlog1.10-fmt9).
    provides = subprocess.run(["dpkg-query", "-W", "-f", "${Provides}",
                               package], capture_output=True,
                              text=True).stdout
    names = {package} | {p.split()[0] for p in provides.split(", ") if p}
    assert names & depends, f"{lib} ({package}) is not in Depends"


def test_deb_contents(deb, installed):
  listing = subprocess.run(["dpkg-deb", "--contents", str(deb)],
                           capture_output=True, text=True,
                           check=True).stdout.splitlines()
  entries = {l.split()[-1].lstrip("."): l.split() for l in listing}
  for b in BINARIES:
    mode, owner = entries[f"/usr/bin/{b}"][:2]
    assert (mode, owner) == ("-rwxr-xr-x", "root/root"), (b, mode, owner)
  for path in ("/lib/systemd/system/kregd.service",
               "/lib/systemd/system/kregd.socket",
               "/lib/systemd/system/nvidia-mps.service",
               "/usr/share/man/man8/kregd.8.gz",
               "/usr/share/man/man1/kregctl.1.gz",
               "/usr/share/bash-completion/completions/kregctl",
               "/usr/share/doc/kregd/kregd.toml.example",
               "/usr/share/doc/kregd/copyright",
               "/etc/kregd/kregd.toml",
               "/usr/share/kregd/include/xla/ffi/api/ffi.h"):
    assert path in entries, path
    assert entries[path][:2] == ["-rw-r--r--", "root/root"], path
  for page, section in (("kregd.8", 8), ("kregctl.1", 1)):
    packed = installed / f"usr/share/man/man{section}/{page}.gz"
    assert gzip.decompress(packed.read_bytes()) == (
        REPO / "docs/man" / page).read_bytes()
  assert (installed / "usr/share/doc/kregd/kregd.toml.example").read_bytes() \
      == (REPO / "docs/kregd.toml.example").read_bytes()


def test_the_packaged_unit_starts_the_packaged_kregd(installed):
  # The repository's unit is for the manual install (/usr/local/bin); the
  # package rewrites ExecStart= to where it installs kregd.
  exec_start = unit_exec_start(installed)
  assert exec_start == ["/usr/bin/kregd", "--config", "/etc/kregd/kregd.toml"]
  assert os.access(installed / exec_start[0].lstrip("/"), os.X_OK)
  # Below their leading comments the packaged units are the repository's,
  # with ExecStart= and SocketGroup= set; their comments describe the
  # package's setup, not the manual install's.
  def split(text):
    head, _, body = text.partition("\n\n")
    return head, body
  repo_head, repo_body = split(
      (REPO / "daemon/systemd/kregd.service").read_text())
  head, body = split(
      (installed / "lib/systemd/system/kregd.service").read_text())
  assert body == repo_body.replace(
      "ExecStart=/usr/local/bin/kregd",
      "ExecStart=/usr/bin/kregd --config /etc/kregd/kregd.toml")
  assert "/usr/local" in repo_head and "/usr/local" not in head, head
  assert "drop-in" not in head and "/etc/kregd/kregd.toml" in head, head
  # The socket is the kregd group's (postinst creates it).
  _, repo_body = split((REPO / "daemon/systemd/kregd.socket").read_text())
  head, body = split(
      (installed / "lib/systemd/system/kregd.socket").read_text())
  assert body == repo_body.replace("#SocketGroup=kregd\n",
                                   "SocketGroup=kregd\n")
  assert "uncomment" not in head and "adduser USER kregd" in head, head
  assert "Purging the package leaves the\n# group" in head, head
  assert (installed / "lib/systemd/system/nvidia-mps.service").read_bytes() \
      == (REPO / "daemon/systemd/nvidia-mps.service").read_bytes()


def test_the_packaged_config_is_a_conffile_kregd_accepts(deb, installed,
                                                         tmp_path):
  control = tmp_path / "control"
  subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True)
  assert (control / "conffiles").read_text().split() == [
      "/etc/kregd/kregd.toml"]
  r = subprocess.run([str(installed / "usr/bin/kregd"), "--check-config",
                      "--config", str(installed / "etc/kregd/kregd.toml")],
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  assert "max_module_bytes = 536870912  # default" in r.stdout


def test_maintainer_scripts_only_reload_a_running_systemd(deb, tmp_path):
  control = tmp_path / "control"
  subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True)
  stubs = tmp_path / "bin"
  stubs.mkdir()
  log = tmp_path / "systemctl.log"
  (stubs / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
  (stubs / "systemctl").chmod(0o755)
  # The host's groups stay as they are: getent finds no kregd group, and
  # groupadd only says what it was asked.
  (stubs / "getent").write_text("#!/bin/sh\nexit 2\n")
  (stubs / "groupadd").write_text(f'#!/bin/sh\necho "groupadd $*" >> {log}\n')
  for stub in ("getent", "groupadd"):
    (stubs / stub).chmod(0o755)
  env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
  calls = [("postinst", "configure"), ("prerm", "upgrade"),
           ("prerm", "remove"), ("postrm", "remove"), ("postrm", "purge")]
  for script, arg in calls:
    assert subprocess.run(["sh", "-n", str(control / script)]).returncode == 0
    r = subprocess.run(["sh", str(control / script), arg], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, (script, arg, r.stderr)
  made = log.read_text().splitlines() if log.exists() else []
  assert made[0] == "groupadd --system kregd", made
  if os.path.isdir("/run/systemd/system"):
    assert made[1:] == ["daemon-reload", "stop kregd.socket kregd.service",
                        "daemon-reload", "daemon-reload"], made
  else:
    assert made[1:] == [], made  # no systemd: nothing is called


def test_installed_unit_passes_systemd_analyze_verify(installed):
  exe = shutil.which("systemd-analyze")
  if exe is None:
    pytest.skip("systemd-analyze is not installed")
  version = subprocess.run([exe, "--version"], capture_output=True,
                           text=True).stdout
  if int(re.search(r"systemd (\d+)", version).group(1)) < 250:
    pytest.skip("systemd-analyze verify --root needs systemd >= 250")
  # --root: ExecStart= must exist in the scratch root; the targets the
  # units hook into (sysinit.target, ...) are not there, hence
  # --recursive-errors=no.
  r = subprocess.run([exe, "verify", "--man=no", "--recursive-errors=no",
                      f"--root={installed}", "kregd.service", "kregd.socket"],
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stdout + r.stderr
  assert r.stderr == "", r.stderr


def test_installed_kregd_runs_a_kernel(installed, monkeypatch):
  import kernels_util as ku  # pylint: disable=import-outside-toplevel
  demo = pathlib.Path(ku.kernels_dir()) / "libdemo.so"
  if not demo.is_file():
    pytest.skip(f"{demo} not built")
  exec_start = unit_exec_start(installed)
  kregd = installed / exec_start[0].lstrip("/")
  kregctl = installed / "usr/bin/kregctl"
  monkeypatch.setenv("KREGD_BINARY", str(kregd))
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-deb-", dir="/tmp"))
  # The unit's arguments; systemd would pass the sockets, the flags name
  # private ones here.
  # /etc/kregd/kregd.toml: the package's, not the host's.
  args = [str(installed / a.lstrip("/")) if a.startswith("/etc/") else a
          for a in exec_start[1:]]
  d = Daemon(root, [os.path.realpath(demo.parent)], args)
  d.start()
  try:
    assert os.path.realpath(f"/proc/{d.pid}/exe") == str(kregd)
    r = subprocess.run([str(kregctl), "--socket", d.socket, "register",
                        "deb.demo.scale", "--module", str(demo), "--function",
                        "Scale", "--platform", "cpu"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr + d.log()
    assert r.stdout.startswith("registered deb.demo.scale (cpu) ")
    code = f"""
import json, os, subprocess
import jax, jax.numpy as jnp, kreg
kreg.bind_ffi_target("deb.demo.scale", platform="cpu")
f = jax.jit(lambda x: jax.ffi.ffi_call("deb.demo.scale", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=2.0))
print(f(jnp.arange(4, dtype=jnp.float32)))
status = json.loads(subprocess.run([{str(kregctl)!r}, "status", "--json"],
                    capture_output=True, text=True, check=True).stdout)
for e in status["executors"]:
  print("EXECUTOR", os.path.realpath(f"/proc/{{e['pid']}}/exe"))
"""
    p = subprocess.run([sys.executable, "-c", code], env=d.env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr + d.log()
    assert "[0. 2. 4. 6.]" in p.stdout
    executors = re.findall(r"^EXECUTOR (\S+)$", p.stdout, re.M)
    assert executors and set(executors) == {
        str(installed / "usr/bin/kregd-exec")}, p.stdout
    # The README's compile example, with the headers the package ships.
    r = subprocess.run([str(kregctl), "--socket", d.socket, "compile",
                        "deb.demo.axpb", "AxpbHandler",
                        str(REPO / "docs/examples/axpb.cc"), "--platform",
                        "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr + d.log()
    assert "XLA FFI headers from " + str(
        installed / "usr/bin/../share/kregd/include") in d.log(None)
    listed = subprocess.run([str(kregctl), "--socket", d.socket, "list",
                             "--json"], capture_output=True, text=True,
                            check=True).stdout
    assert sorted(t["target_name"] for t in json.loads(listed)) == [
        "deb.demo.axpb", "deb.demo.scale"]
  finally:
    finish_test_daemon(d)


def test_build_deb_names_a_binary_that_is_not_built(tmp_path):
  r = subprocess.run(["bash", str(REPO / "tools/build_deb.sh"),
                      str(tmp_path / "empty"), str(tmp_path / "out")],
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 1
  assert (f"build_deb: {tmp_path / 'empty'}/daemon/kregd/kregd is not built; run: "
          "bazel build //daemon/kregd:kregd //daemon/executor:kregd-probe "
          "//daemon/executor:kregd-exec //daemon/kregd_compile:kregd-compile "
          "//client/kregctl") in r.stderr
  assert not (tmp_path / "out").exists()


def test_build_deb_maps_libraries_to_packages_without_dpkg_shlibdeps(
    deb, tmp_path):
  # Where dpkg-shlibdeps fails, Depends comes from ldd and dpkg -S (no
  # versions, the same packages).
  stubs = tmp_path / "bin"
  stubs.mkdir()
  (stubs / "dpkg-shlibdeps").write_text("#!/bin/sh\nexit 2\n")
  (stubs / "dpkg-shlibdeps").chmod(0o755)
  env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
  r = subprocess.run(["bash", str(REPO / "tools/build_deb.sh"), str(BIN_DIR),
                      str(tmp_path / "out")], capture_output=True, text=True,
                     env=env, timeout=300)
  assert r.returncode == 0, r.stderr
  simple = pathlib.Path(r.stdout.strip().splitlines()[-1])
  plain = set(field(simple, "Depends").split(", "))
  assert "(" not in field(simple, "Depends")
  assert {"libc6", "libstdc++6", "libsystemd0"} <= plain
  assert any(p.startswith("libgrpc++") for p in plain), plain
  versioned = {d.split()[0] for d in field(deb, "Depends").split(", ")}
  assert versioned - {"libspdlog1.10-fmt9"} <= plain
