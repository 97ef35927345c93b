"""The `kregctl` command of the kreg wheel: runs the kregctl binary that
tools/build_wheel.py bundles next to this module (kregd's admin command
line; `man kregctl`, docs/errors.md for its exit codes)."""

from __future__ import annotations

import os
import pathlib
import sys


def main() -> int:
  exe = pathlib.Path(__file__).with_name("kregctl")
  if not exe.is_file():
    print(f"kregctl: this kreg install has no bundled kregctl ({exe} is "
          "missing; `pip install ./client/python` installs the package "
          "without it); install the wheel tools/build_wheel.sh builds, or "
          "use the kregctl of the kregd package", file=sys.stderr)
    return 1
  os.execv(exe, ["kregctl", *sys.argv[1:]])
  return 1  # not reached


if __name__ == "__main__":
  sys.exit(main())
