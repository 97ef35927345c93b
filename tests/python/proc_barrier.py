"""A file barrier between a parent and the child processes it starts
(tests/gpu/test_multi_gpu.py's clients, bench/bench_two_gpus.py's):
a child `arrive`s at a named point (creates DIR/<point>.ready.<name>) and
waits for the parent's `release` of it (DIR/<point>.go)."""

from __future__ import annotations

import pathlib
import time
from typing import Callable, Iterable, Optional


def _touch(path: pathlib.Path, text: str = "") -> None:
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text)
  tmp.rename(path)  # atomic: a reader never sees a half-written file


def wait_for(cond: Callable[[], bool], timeout: float, what: str,
             check: Optional[Callable[[], None]] = None) -> None:
  """Polls `cond` until true; TimeoutError naming `what` after `timeout`
  seconds. `check` runs on each poll (e.g. to fail fast on a dead child)."""
  deadline = time.monotonic() + timeout
  while not cond():
    if check is not None:
      check()
    if time.monotonic() > deadline:
      raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
    time.sleep(0.05)


class Barrier:

  def __init__(self, directory: pathlib.Path | str):
    self.dir = pathlib.Path(directory)

  # The child's side.
  def arrive(self, point: str, name: str, timeout: float,
             text: str = "") -> None:
    """Says `name` reached `point`, then waits for the parent's release."""
    _touch(self.dir / f"{point}.ready.{name}", text)
    go = self.dir / f"{point}.go"
    wait_for(go.exists, timeout, f"the release of {point}")

  # The parent's side.
  def arrived(self, point: str, names: Iterable[str]) -> bool:
    return all((self.dir / f"{point}.ready.{n}").exists() for n in names)

  def release(self, point: str) -> None:
    _touch(self.dir / f"{point}.go")
