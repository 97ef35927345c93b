"""An entry of kregd's registry as kreg returns it."""

from __future__ import annotations

import dataclasses
from typing import Optional

# XLA FFI's execution stages, in the order XLA runs them.
STAGES = ("instantiate", "prepare", "initialize", "execute")


@dataclasses.dataclass(frozen=True)
class Target:
  """One entry of kregd's registry."""
  target_name: str
  platform: str
  func_name: str
  content_id: str
  module_digest: str
  module_size: int
  kind: str
  ffi_api_major: int
  ffi_api_minor: int
  traits: int
  uid: int
  gid: int
  pid: int
  registered_at_us: int
  origin: str
  # Empty when the daemon can run the target; otherwise why not (a cuda
  # target on a kregd without a usable GPU, an unloadable module).
  not_runnable: str = ""
  # Cluster mode: the host whose registration made the binding ("<host
  # name> (<peer address>)"); empty on a standalone kregd.
  host: str = ""

  @property
  def runnable(self) -> bool:
    return not self.not_runnable

  @property
  def stages(self) -> dict[str, str]:
    """The handler of each execution stage ({"execute": func_name} for an
    execute-only target; a handler bundle's every stage)."""
    if "=" not in self.func_name:
      return {"execute": self.func_name}
    parts = (p.split("=", 1) for p in self.func_name.split(";"))
    return {k: v for k, v in parts if k in STAGES}

  @property
  def state_type(self) -> Optional[tuple[str, str, str]]:
    """A handler bundle's state type: (name, type-id symbol, type-info
    symbol), or None."""
    for part in self.func_name.split(";"):
      if part.startswith("state_type="):
        name, tid, info = part[len("state_type="):].split("/")
        return name, tid, info
    return None
