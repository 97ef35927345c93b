"""The docs stay true to the binaries: the example config has every key
kregd reads and kregd starts with it; the man pages are what
tools/gen_manpages.py generates from --help; the bash completion offers
kregctl's real commands; the README and the systemd units point at docs in
the repository."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("KREG_BIN_DIR", REPO / "bazel-bin"))
KREGD = BIN_DIR / "daemon" / "kregd"
KREGCTL = BIN_DIR / "client" / "kregctl"
EXAMPLE = REPO / "docs" / "kregd.toml.example"


def need(path: pathlib.Path):
  if not path.is_file():
    pytest.skip(f"{path} not built")


def test_example_config_names_every_key_kregd_reads():
  # The keys ApplyToml compares against (`k == "socket"` ...).
  keys = set()
  for src in ("daemon/config.cc", "daemon/config_cluster.cc"):
    keys |= set(re.findall(r'\bk == "(\w+)"', (REPO / src).read_text()))
  assert len(keys) >= 8, keys
  text = EXAMPLE.read_text()
  for key in sorted(keys):
    assert re.search(rf"^{key} = ", text, re.M), f"{key} missing from {EXAMPLE}"


def test_kregd_starts_with_the_example_config(tmp_path):
  need(KREGD)
  sock = tmp_path / "k.sock"
  proc = subprocess.Popen([str(KREGD), "--config", str(EXAMPLE), "--socket",
                           str(sock), "--state-dir", str(tmp_path / "state")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  try:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
      assert proc.poll() is None, proc.stdout.read().decode()
      # The gRPC socket, once the session socket exists (probing the session
      # socket would start an executor for nothing).
      s = socket.socket(socket.AF_UNIX)
      try:
        if not os.path.exists(str(sock) + ".session"):
          raise OSError("not yet")
        s.connect(str(sock))
        break
      except OSError:
        time.sleep(0.05)
      finally:
        s.close()
    else:
      pytest.fail("kregd did not start with the example config")
  finally:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
  assert proc.returncode == 0


def test_man_pages_are_generated_from_the_current_help(tmp_path):
  need(KREGD)
  need(KREGCTL)
  r = subprocess.run([sys.executable, str(REPO / "tools/gen_manpages.py"),
                      str(BIN_DIR), str(tmp_path)], capture_output=True,
                     text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  for page in ("kregd.8", "kregctl.1"):
    fresh = (tmp_path / page).read_text()
    # The default socket follows $XDG_RUNTIME_DIR: compare without it.
    norm = lambda t: re.sub(r"TEXT=\S+", "TEXT=<default>", t)
    assert norm(fresh) == norm((REPO / "docs/man" / page).read_text()), (
        f"docs/man/{page} is stale: run tools/gen_manpages.py")
  help_text = subprocess.run([str(KREGCTL), "--help"], capture_output=True,
                             text=True).stdout
  commands = re.findall(r"^  (\w[\w-]*)\s{2,}",
                        help_text.split("Subcommands:")[-1], re.M)
  page = (REPO / "docs/man/kregctl.1").read_text()
  for c in commands:
    assert f".SS {c}\n" in page


def test_bash_completion_offers_kregctl_commands_and_options():
  need(KREGCTL)
  script = f"""
source {REPO}/docs/completion/kregctl.bash
c() {{ COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=(); _kregctl; echo "${{COMPREPLY[*]}}"; }}
c {KREGCTL} ""
c {KREGCTL} reg
c {KREGCTL} register --pla
c {KREGCTL} register --platform c
c {KREGCTL} show --j
"""
  r = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                     timeout=60)
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert set("list show status health register".split()) <= set(lines[0].split())
  assert lines[1:] == ["register", "--platform", "cpu cuda", "--json"]


def test_readme_and_units_point_at_docs_in_the_repo():
  for path in [REPO / "README.md", *(REPO / "daemon/systemd").glob("kregd.*")]:
    text = path.read_text()
    assert "../shared" not in text and "DESIGN.md" not in text, path
  readme = (REPO / "README.md").read_text()
  for doc in re.findall(r"\]\((docs/[^)#]+)", readme):
    assert (REPO / doc).exists(), doc
  assert "docs/design.md" in readme
