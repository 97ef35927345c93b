#!/usr/bin/env python3
"""Generates docs/man/kregd.8 and docs/man/kregctl.1: OPTIONS and COMMANDS
from the binaries' --help text (so they cannot drift from the flags),
kregctl's EXIT STATUS from docs/errors.md ("Exit status of kregctl"), and
fixed DESCRIPTION, FILES, EXAMPLES and SEE ALSO sections.

    tools/gen_manpages.py [BIN_DIR [OUT_DIR]]   # default: bazel-bin docs/man
    man -l docs/man/kregctl.1
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

ERRORS_MD = REPO / "docs" / "errors.md"

KREGD_DESCRIPTION = """.SH DESCRIPTION
.B kregd
hosts XLA FFI kernels for JAX processes. Clients (the
.B kreg
Python package, its shim
.IR libkreg_client.so ,
and
.BR kregctl (1))
register a kernel module and handler symbol under a target name; kregd
checks the module in a helper process
.RB ( kregd\\-probe ),
stores it content-addressed, journals the registration and keeps the name
bound to that content across restarts. Calls run in executors
.RB ( kregd\\-exec )
that kregd starts as the calling client's uid, grouped by
.BR isolation ,
so a crashing kernel takes down its executor, not the daemon or the JAX
process; clients may also run a registered kernel in their own process
.RB ( local_execution ).
With
.B \\-\\-etcd\\-endpoints
several hosts share one registry (cluster mode).
.PP
kregd listens on a gRPC Unix socket (admin and registration) and on
.I <socket>.session
(the data plane of libkreg_client.so). Under systemd it is socket-activated
.RB ( kregd.socket )
and sends READY=1 once the journal is replayed.
"""

KREGD_EXTRA = """.SH CONFIGURATION
Embedded defaults, overridden by the TOML file given with
.BR \\-\\-config ,
then by flags. Every key is described in
.IR kregd.toml.example .
An unknown key, a wrong type, an unknown log level, an allowed root that does
not exist or an unknown socket_group is an error (exit 2).
.B kregctl config
prints the configuration a running kregd uses, each value followed by where
it came from, as a file kregd accepts back.
.SH FILES
.TP
.I /etc/kregd/kregd.toml
the conventional config file; read only when named with
.B \\-\\-config
(under systemd: in a drop-in for kregd.service).
.TP
.I /usr/share/doc/kregd/kregd.toml.example
every key with its default and meaning (docs/kregd.toml.example in the
repository).
.TP
.I /run/kregd/kregd.sock
gRPC socket, mode 0660 (the default when $XDG_RUNTIME_DIR is unset; else
\\fI$XDG_RUNTIME_DIR/kregd/kregd.sock\\fR).
.TP
.I /run/kregd/kregd.sock.session
session socket of libkreg_client.so (calls, buffers); not for gRPC clients.
.TP
.I /var/lib/kregd
state directory (the default when $XDG_STATE_HOME is unset; else
\\fI$XDG_STATE_HOME/kregd\\fR): journal, module store and lock; only kregd
reads it.
.TP
.I /var/lib/kregd/journal
every accepted registration, fsynced before the reply, replayed at start.
.TP
.I /var/lib/kregd/modules/sha256\\-<hex>.so
content-addressed module store.
.TP
.I /var/lib/kregd/compile/<hex>.so
compile cache: modules the compile service built, by cache key
(compile_cache_bytes, least recently used evicted first).
.TP
.I kregd\\-exec\\fR, \\fPkregd\\-probe\\fR, \\fPkregd\\-compile
executor, probe and compile worker, found in the directory of the kregd
binary.
.TP
.I /lib/systemd/system/kregd.service\\fR, \\fPkregd.socket\\fR, \\fPnvidia\\-mps.service
systemd units (the Debian package installs them there; a manual install
puts them in /etc/systemd/system).
.SH SIGNALS
SIGTERM and SIGINT shut kregd down cleanly; executors serve their sessions
on for up to orphan_timeout seconds.
.SH EXIT STATUS
.TP
.B 0
clean shutdown, or \\-\\-help/\\-\\-version.
.TP
.B 1
kregd could not start (socket or state directory in use by another kregd, a
metrics port in use, kregd\\-exec missing).
.TP
.B 2
a bad flag or config value; the message names it.
.SH EXAMPLES
Run as a service (socket-activated, state in /var/lib/kregd):
.PP
.RS
.nf
systemctl enable \\-\\-now kregd.socket
kregctl \\-\\-socket /run/kregd/kregd.sock health
.fi
.RE
.PP
Run by hand on a private socket, reading modules under /opt/kernels:
.PP
.RS
.nf
kregd \\-\\-socket /tmp/k/kregd.sock \\-\\-state\\-dir /tmp/k/state \\\\
      \\-\\-allow\\-root /opt/kernels \\-\\-log\\-level debug
.fi
.RE
.PP
Turn the flags of a running kregd into a config file:
.PP
.RS
.nf
kregctl config > /etc/kregd/kregd.toml
kregd \\-\\-config /etc/kregd/kregd.toml
.fi
.RE
.SH SEE ALSO
.BR kregctl (1),
.BR systemd.socket (5),
.BR systemd.service (5);
docs/operator-guide.md, docs/errors.md and docs/design.md in the kregd
repository.
"""

KREGCTL_DESCRIPTION = """.SH DESCRIPTION
.B kregctl
is the admin command line of
.BR kregd (8):
it lists and shows registered targets, registers, retires and unquarantines
them, shows the daemon's status, sessions and effective configuration, and
checks its health, over kregd's gRPC socket. The daemon's error message goes
to stderr unchanged; the exit status says what kind of error it was.
Commands that take
.B \\-\\-json
print JSON for scripts.
"""

KREGCTL_EXTRA = """.SH ENVIRONMENT
.TP
.B KREGD_SOCKET
default for \\-\\-socket: kregd's gRPC socket (not the .session one).
.SH FILES
.TP
.I /run/kregd/kregd.sock
kregd's default gRPC socket (\\fI$XDG_RUNTIME_DIR/kregd/kregd.sock\\fR when
$XDG_RUNTIME_DIR is set).
.TP
.I /usr/share/bash\\-completion/completions/kregctl
bash completion (docs/completion/kregctl.bash in the repository).
.SH EXAMPLES
.RS
.nf
kregctl status
kregctl register demo.scale \\-\\-module /opt/kernels/libdemo.so \\\\
        \\-\\-function scale \\-\\-platform cpu
kregctl list \\-\\-json
kregctl show demo.scale
kregctl compile demo.axpb AxpbHandler axpb.cc \\-\\-header axpb.h
kregctl config
KREGD_SOCKET=/tmp/k/kregd.sock kregctl health
.fi
.RE
.SH SEE ALSO
.BR kregd (8);
docs/user-guide.md and docs/errors.md in the kregd repository.
"""


def md_inline(text: str) -> str:
  """Markdown `code` as bold, everything else escaped for roff."""
  return re.sub(r"`([^`]+)`", r"\\fB\1\\fR", esc(text))


def kregctl_exit_status() -> str:
  """EXIT STATUS from the list in docs/errors.md ("Exit status of kregctl"),
  word for word."""
  text = ERRORS_MD.read_text()
  m = re.search(r"^## Exit status of kregctl\n(.*?)(?=^#)", text, re.S | re.M)
  if not m:
    raise SystemExit(f"{ERRORS_MD} has no section 'Exit status of kregctl'")
  items = re.findall(r"^- `(\d)`: (.*?)(?=^- |\Z)", m.group(1).strip() + "\n",
                     re.S | re.M)
  out = ".SH EXIT STATUS\n"
  for code, body in items:
    out += f".TP\n.B {code}\n{md_inline(' '.join(body.split()))}\n"
  return out


def esc(line: str) -> str:
  line = line.replace("\\", "\\\\").replace("-", "\\-")
  return ("\\&" + line) if line.startswith((".", "'")) else line


def help_text(binary: pathlib.Path, *args: str) -> str:
  out = subprocess.run([str(binary), *args, "--help"], capture_output=True,
                       text=True, check=False).stdout
  return re.sub(r"Usage: \S*/", "Usage: ", out)


def block(title: str, text: str) -> str:
  body = "\n".join(esc(l) for l in text.rstrip().splitlines())
  return f".SS {title}\n.nf\n{body}\n.fi\n" if title else f".nf\n{body}\n.fi\n"


def page(name: str, section: str, summary: str, sections: str) -> str:
  return (f'.TH {name.upper()} {section} "" "kregd" "kregd manual"\n'
          f".\\\" Generated by tools/gen_manpages.py; do not edit.\n"
          f".SH NAME\n{name} \\- {summary}\n{sections}")


def main() -> int:
  bin_dir = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bazel-bin"
  kregd = bin_dir / "daemon" / "kregd" / "kregd"
  kregctl = bin_dir / "client" / "kregctl" / "kregctl"
  out = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else REPO / "docs" / "man"
  out.mkdir(parents=True, exist_ok=True)

  d = help_text(kregd)
  (out / "kregd.8").write_text(page(
      "kregd", "8", "out-of-process kernel registry and executor for JAX's "
      "XLA FFI",
      ".SH SYNOPSIS\n.B kregd\n[\\fIOPTION\\fR]...\n" + KREGD_DESCRIPTION +
      ".SH OPTIONS\n" + block("", d) + KREGD_EXTRA))

  c = help_text(kregctl)
  subs = re.findall(r"^  (\w[\w-]*)\s{2,}", c.split("Subcommands:")[-1], re.M)
  body = (".SH SYNOPSIS\n.B kregctl\n[\\fB\\-\\-socket\\fR \\fIPATH\\fR] "
          "\\fICOMMAND\\fR [\\fIARGS\\fR]...\n" + KREGCTL_DESCRIPTION +
          ".SH OPTIONS\n" + block("", c) + ".SH COMMANDS\n")
  for sub in subs:
    body += block(sub, help_text(kregctl, sub))
  (out / "kregctl.1").write_text(page(
      "kregctl", "1", "inspect and drive kregd",
      body + kregctl_exit_status() + KREGCTL_EXTRA))
  print(f"wrote {out / 'kregd.8'} and {out / 'kregctl.1'} "
        f"({len(subs)} kregctl commands)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
