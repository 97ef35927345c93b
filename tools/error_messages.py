#!/usr/bin/env python3
"""Lists the error messages kregd, kregctl, the shim and kreg can return, as
they appear in the source: code, file:line and the message with each
computed part shown as <...>. docs/errors.md is curated from this output;
rerun it after changing messages:

    tools/error_messages.py [--markdown]
"""

from __future__ import annotations

import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
CPP = re.compile(
    r"absl::(\w+)Error\(|ClientStatus::Error\(\s*(k\w+)|"
    r"return Invalid\(|raise (\w+Error)\(")


def call_text(src: str, start: int) -> str:
  """The argument text of the call whose '(' precedes `start`."""
  depth, i = 1, start
  while i < len(src) and depth:
    c = src[i]
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
    elif c in "\"'":
      q, i = c, i + 1
      while i < len(src) and src[i] != q:
        i += 2 if src[i] == "\\" else 1
    i += 1
  return src[start:i - 1]


def render(args: str) -> str:
  parts = []
  for m in re.finditer(r'f?"((?:[^"\\]|\\.)*)"|([^",\s][^,]*)', args):
    if m.group(1) is not None:
      parts.append(re.sub(r"\{[^}]*\}", "<...>", m.group(1)))
    elif m.group(2).strip() and not m.group(2).strip().startswith(("k", "+")):
      parts.append("<...>")
  text = "".join(parts)
  text = re.sub(r"(<\.\.\.>)+", "<...>", text).replace('\\"', '"')
  return text.replace("\\n", " ").strip()


def main() -> int:
  md = "--markdown" in sys.argv
  files = sorted(p for p in list((REPO / "daemon").rglob("*.cc")) +
                 list((REPO / "client").rglob("*.cc")) +
                 list((REPO / "client/python/kreg").glob("*.py")))
  for path in files:
    src = path.read_text()
    for m in CPP.finditer(src):
      code = m.group(1) or m.group(2) or m.group(3) or "InvalidArgument"
      msg = render(call_text(src, m.end()))
      if not msg or msg == "<...>":
        continue
      line = src.count("\n", 0, m.start()) + 1
      rel = path.relative_to(REPO)
      if md:
        print(f"| {code} | `{rel}:{line}` | {msg.replace('|', '/')} |")
      else:
        print(f"{code:20} {rel}:{line}: {msg}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
