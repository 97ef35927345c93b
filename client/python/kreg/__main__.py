"""`python -m kreg` (also installed as the `kreg` command): inspect kregd
from the Python client, without kregctl.

    kreg [--socket PATH] list [--json]
    kreg [--socket PATH] show NAME [--platform cpu|cuda] [--json]
    kreg [--socket PATH] status [--json]
    kreg --version

Exit codes as kregctl's: 0 success, 1 other errors, 2 usage or invalid
argument, 4 daemon unreachable. Registration stays with
kreg.register_ffi_target (Python) and `kregctl register` (shell).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys

import kreg
from kreg import _client, _shim
from kreg._errors import DaemonNotRunningError, KregError, ShimNotFoundError


def _time(us: int) -> str:
  return datetime.datetime.fromtimestamp(
      us / 1e6, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _as_dict(t: _client.Target) -> dict:
  d = dataclasses.asdict(t)
  d["registered_at"] = _time(t.registered_at_us)
  d["runnable"] = t.runnable
  return d


def _table(targets: list[_client.Target]) -> None:
  print(f"{'NAME':32} {'PLAT':5} {'RUN':4} {'FUNCTION':20} {'CONTENT':22} "
        f"{'KIND':10} {'UID':6} {'PID':8} REGISTERED")
  for t in targets:
    print(f"{t.target_name:32} {t.platform:5} "
          f"{'yes' if t.runnable else 'no':4} {t.func_name:20} "
          f"{t.content_id[:22]:22} {t.kind:10} {t.uid:<6} {t.pid:<8} "
          f"{_time(t.registered_at_us)}")
  for t in targets:
    if not t.runnable:
      print(f"not runnable here: {t.target_name} ({t.platform}): "
            f"{t.not_runnable}")


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="kreg", description="Inspect kregd from the kreg Python client.")
  p.add_argument("--version", action="version",
                 version=f"kreg {kreg.__version__}")
  p.add_argument("--socket", default=None,
                 help="kregd's gRPC socket (default: $KREGD_SOCKET, else the "
                 "daemon's default)")
  sub = p.add_subparsers(dest="command", metavar="COMMAND")
  ls = sub.add_parser("list", help="list registered targets")
  ls.add_argument("--json", action="store_true")
  show = sub.add_parser("show", help="show one target")
  show.add_argument("name")
  show.add_argument("--platform", default="")
  show.add_argument("--json", action="store_true")
  st = sub.add_parser("status", help="daemon reachability, shim and JAX")
  st.add_argument("--json", action="store_true")
  return p


def _run(args) -> int:
  client = _client.Client(args.socket)
  if args.command == "list":
    targets = client.list_registered_targets()
    if args.json:
      print(json.dumps([_as_dict(t) for t in targets], indent=2))
    else:
      _table(targets)
    return 0
  if args.command == "show":
    platform = _client._canonical_platform(args.platform)  # pylint: disable=protected-access
    found = [t for t in client.list_registered_targets()
             if t.target_name == args.name and
             (not platform or t.platform == platform)]
    if not found:
      print(f"no target \"{args.name}\""
            f"{' on platform ' + platform if platform else ''} is registered; "
            "`kreg list` shows what is", file=sys.stderr)
      return 1
    if args.json:
      print(json.dumps([_as_dict(t) for t in found], indent=2))
    else:
      for t in found:
        for k, v in _as_dict(t).items():
          print(f"{k}: {v}")
        print()
    return 0
  # status
  v = _shim.version()
  targets = client.list_registered_targets()
  info = {
      "socket": client.address,
      "reachable": True,
      "targets": len(targets),
      "not_runnable": sum(1 for t in targets if not t.runnable),
      "kreg": kreg.__version__,
      "shim": str(_shim.loaded_path()),
      "shim_c_abi": f"{v.api_major}.{v.api_minor}",
      "shim_ffi_api": f"{v.ffi_api_major}.{v.ffi_api_minor}",
      "supported_jax": _client.SUPPORTED_JAX,
  }
  info.update({f"client_{k}": n for k, n in client.stats().items()})
  if args.json:
    print(json.dumps(info, indent=2))
  else:
    for k, val in info.items():
      print(f"{k}: {val}")
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = _parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_usage(sys.stderr)
    print("kreg: a command is needed (list, show, status)", file=sys.stderr)
    return 2
  try:
    return _run(args)
  except DaemonNotRunningError as e:
    print(e.message, file=sys.stderr)
    return 4
  except ShimNotFoundError as e:
    print(e, file=sys.stderr)
    return 1
  except KregError as e:
    print(e.message, file=sys.stderr)
    return 2 if e.code in ("INVALID_ARGUMENT", "UNIMPLEMENTED") else 1


if __name__ == "__main__":
  sys.exit(main())
