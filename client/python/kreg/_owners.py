"""Whom a process trusts to have registered the targets it binds by name
(docs/user-guide.md, "Trusting a target's owner"): bind_ffi_target and
bind_exported run a target's module in (or for) this process, so a caller
can refuse targets registered by anyone but the owners it names; a
registration that matched another uid's target is checked the same way."""

from __future__ import annotations

import grp
import os
import pwd
import threading
from typing import Any, Iterable, Optional

from kreg._errors import UntrustedTargetError

_lock = threading.Lock()
_configured: Optional[tuple[str, ...]] = None


def _spell(owners: Iterable[Any], origin: str) -> tuple[str, ...]:
  """Owners as strings; ValueError naming a form that is not one."""
  if isinstance(owners, (str, int)):
    owners = [owners]
  out = []
  for o in owners:
    if isinstance(o, bool) or not isinstance(o, (int, str)) or o == "":
      raise ValueError(
          f"{origin}: {o!r} is not an owner; give user names or uids, or "
          '"group:NAME" / "group:GID"')
    out.append(str(o))
  return tuple(out)


def configure(owners: Optional[Iterable[Any]]) -> None:
  """kreg.configure(trusted_owners=...): the process's default."""
  global _configured
  with _lock:
    _configured = None if owners is None else _spell(
        owners, "kreg.configure(trusted_owners=...)")


def default() -> Optional[tuple[str, ...]]:
  """kreg.configure(trusted_owners=...), else $KREG_TRUSTED_OWNERS
  (comma-separated), else None: every owner is trusted."""
  with _lock:
    if _configured is not None:
      return _configured
  env = os.environ.get("KREG_TRUSTED_OWNERS")
  if env:
    return _spell([o.strip() for o in env.split(",") if o.strip()],
                  "KREG_TRUSTED_OWNERS")
  return None


def _user(uid: int) -> str:
  try:
    return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
  except KeyError:
    return f"uid {uid}"


def _groups_of(uid: int, gid: int) -> set[int]:
  """The registering process's gid and its user's groups."""
  try:
    pw = pwd.getpwuid(uid)
    return set(os.getgrouplist(pw.pw_name, pw.pw_gid)) | {gid}
  except KeyError:
    return {gid}


def _resolve(owner: str) -> tuple[str, int]:
  """("uid", n) or ("gid", n); ValueError for a name this host lacks."""
  kind, name = ("gid", owner[6:]) if owner.startswith("group:") else (
      "uid", owner)
  if name.isdigit():
    return kind, int(name)
  try:
    return kind, (grp.getgrnam(name).gr_gid if kind == "gid" else
                  pwd.getpwnam(name).pw_uid)
  except KeyError:
    raise ValueError(
        f"trusted owner {owner!r} is no {'group' if kind == 'gid' else 'user'}"
        ' on this host; give user names or uids, or "group:NAME" / '
        '"group:GID"') from None


def check(target: Any, owners: Optional[Iterable[Any]],
          registering: bool = False) -> None:
  """UntrustedTargetError unless `target` (a kreg.Target) was registered
  by root, by this process's uid or by one of `owners` (a uid, or a member
  of a group); None: the default (every owner when there is none).
  `registering`: this process's registration matched `target` (a no-op),
  so it would run that target's content (DESIGN §14 rule 1)."""
  spelled = default() if owners is None else _spell(owners, "owners")
  if spelled is None or target.uid in (0, os.getuid()):
    return
  resolved = [_resolve(o) for o in spelled]
  groups = None
  for kind, n in resolved:
    if kind == "uid" and target.uid == n:
      return
    if kind == "gid":
      groups = groups if groups is not None else _groups_of(target.uid,
                                                            target.gid)
      if n in groups:
        return
  if registering:
    raise UntrustedTargetError(
        f'target "{target.target_name}" ({target.platform}) is already '
        f"registered by {_user(target.uid)}, who is not among the owners "
        f"this process trusts ({', '.join(spelled)}): this registration "
        "matched that user's target, so this process would run that "
        "user's module. Register your build under a name of your own (a "
        "prefix of yours), add the user to "
        "$KREG_TRUSTED_OWNERS or kreg.configure(trusted_owners=...) if you "
        "trust its code, or ask the operator to reserve the name for its "
        "rightful owner (`kregctl reserve`)", target.uid)
  raise UntrustedTargetError(
      f'target "{target.target_name}" ({target.platform}) was registered by '
      f"{_user(target.uid)}, who is not among the owners this process "
      f"trusts ({', '.join(spelled)}): binding it would run that user's "
      "module for this process. Bind it only if you trust its code (add "
      "the user to owners= or $KREG_TRUSTED_OWNERS), or ask the operator to "
      "reserve the name for its rightful owner (`kregctl reserve`)",
      target.uid)
