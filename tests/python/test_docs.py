"""The docs stay true to the binaries: the example config has every key
kregd reads and kregd starts with it; the man pages are what
tools/gen_manpages.py generates from --help; the bash completion offers
kregctl's real commands; the README and the systemd units point at docs in
the repository; the install steps install every binary kregd needs; the
user guide's second-process example and the kernel-author guide's handler
run as written."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("KREG_BIN_DIR", REPO / "bazel-bin"))
KREGD = BIN_DIR / "daemon" / "kregd" / "kregd"
KREGCTL = BIN_DIR / "client" / "kregctl" / "kregctl"
EXAMPLE = REPO / "docs" / "kregd.toml.example"
# A row of the config key table (daemon/config/config_keys.cc): its key.
KEY_ROW = r'\bKey(?:String|Strings|Bool|Int|Float|Custom)\(\s*"(\w+)"'


def need(path: pathlib.Path):
  if not path.is_file():
    pytest.skip(f"{path} not built")


def test_example_config_names_every_key_kregd_reads():
  # The rows of the key table ApplyToml reads (`KeyString("socket", ...`).
  keys = set(re.findall(KEY_ROW, (REPO / "daemon/config/config_keys.cc").read_text()))
  assert len(keys) >= 8, keys
  text = EXAMPLE.read_text()
  for key in sorted(keys):
    assert re.search(rf"^{key} = ", text, re.M), f"{key} missing from {EXAMPLE}"


def test_the_unknown_key_message_lists_every_key_kregd_reads(tmp_path):
  # The message lists the key table's keys: every row, nothing else.
  need(KREGD)
  keys = set(re.findall(KEY_ROW, (REPO / "daemon/config/config_keys.cc").read_text()))
  config = tmp_path / "k.toml"
  config.write_text("isolaton = \"client\"\n")
  p = subprocess.run([str(KREGD), "--config", str(config)],
                     capture_output=True, text=True, timeout=30)
  assert p.returncode == 2
  m = re.search(r'unknown key "isolaton" \(did you mean "isolation"\? '
                r"known: ([^)]*)\)", p.stderr)
  assert m, p.stderr
  assert set(m.group(1).split(", ")) == keys


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


MAN_SECTIONS = {
    "kregd.8": ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "CONFIGURATION",
                "FILES", "SIGNALS", "EXIT STATUS", "EXAMPLES", "SEE ALSO"],
    "kregctl.1": ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS",
                  "EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES",
                  "SEE ALSO"],
}


@pytest.mark.parametrize("page", sorted(MAN_SECTIONS))
def test_man_pages_have_their_sections(page):
  text = (REPO / "docs/man" / page).read_text()
  found = re.findall(r"^\.SH (.+)$", text, re.M)
  assert found == MAN_SECTIONS[page], found
  # OPTIONS is the --help text.
  options = text.split(".SH OPTIONS\n")[1].split(".SH ")[0]
  assert "\\-\\-help" in options and "\\-\\-version" in options
  assert "\\-\\-socket" in options


def test_kregctl_exit_status_is_the_list_in_errors_md():
  # One list (docs/errors.md), word for word in the man page.
  md = section(REPO / "docs/errors.md", "Exit status of kregctl")
  items = re.findall(r"^- `(\d)`: (.*?)(?=^- |\Z)", md.strip() + "\n",
                     re.S | re.M)
  assert [c for c, _ in items] == ["0", "1", "2", "3", "4"]
  page = (REPO / "docs/man/kregctl.1").read_text()
  exit_status = page.split(".SH EXIT STATUS\n")[1].split(".SH ")[0]
  for code, body in items:
    words = " ".join(body.split())
    roff = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", words.replace("-", "\\-"))
    assert f".TP\n.B {code}\n{roff}\n" in exit_status, (code, exit_status)
  # The mapping in kregctl itself.
  src = (REPO / "client/kregctl/common.cc").read_text()
  for code in ("kInvalidArgument", "kUnimplemented"):
    assert re.search(rf"case absl::StatusCode::{code}:[^}}]*?return 2;", src)
  assert re.search(r"kFailedPrecondition:\s*return 3;", src)
  assert re.search(r"kUnavailable:\s*return 4;", src)


@pytest.mark.parametrize("page", sorted(MAN_SECTIONS))
def test_man_pages_render_without_warnings(page):
  path = REPO / "docs/man" / page
  env = {**os.environ, "MANWIDTH": "80", "LC_ALL": "C.UTF-8"}
  if shutil.which("man"):
    cmd = ["man", "--warnings", "-l", str(path)]
  elif shutil.which("groff"):
    cmd = ["groff", "-man", "-Tutf8", "-ww", "-z", str(path)]
  else:
    pytest.skip("neither man nor groff is installed")
  r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
  assert r.returncode == 0, r.stderr
  assert r.stderr == "", r.stderr
  if cmd[0] == "man":
    assert "EXIT STATUS" in r.stdout and "EXAMPLES" in r.stdout


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


# -- docs that are followed literally ------------------------------------------


def code_blocks(path: pathlib.Path, lang: str) -> list[str]:
  return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S)


def section(path: pathlib.Path, heading: str) -> str:
  """The text of the Markdown section `heading` (up to the next heading of
  the same or a higher level)."""
  text = path.read_text()
  m = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.M)
  assert m, f"{path} has no section {heading!r}"
  level = len(m.group(1))
  rest = text[m.end():]
  end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
  return rest[:end.start()] if end else rest


def test_install_steps_install_every_binary_kregd_starts():
  # kregd runs its helpers from its own directory (HelperBinary(configured,
  # "NAME", package)).
  helpers = set(
      re.findall(r'HelperBinary\([^,]+,\s*"(kregd-[\w-]+)"', "".join(
          (REPO / f"daemon/kregd/{f}").read_text()
          for f in ("server.cc", "sessions_part.cc", "compile_part.cc"))))
  assert helpers == {"kregd-probe", "kregd-exec", "kregd-compile"}, helpers
  unit = (REPO / "daemon/systemd/kregd.service").read_text()
  exec_start = re.search(r"^ExecStart=(\S+)/kregd$", unit, re.M)
  assert exec_start, "kregd.service: ExecStart= is not <dir>/kregd"
  bindir = exec_start.group(1)
  steps = {
      "docs/operator-guide.md": section(REPO / "docs/operator-guide.md",
                                        "Install as a system service"),
      "README.md": section(REPO / "README.md", "systemd"),
      "daemon/systemd/kregd.service": unit.split("\n\n")[0],
  }
  for where, text in steps.items():
    text = text.replace("\\\n", " ")  # shell line continuations
    installs = " ".join(l for l in text.splitlines()
                        if re.search(r"\binstall\b.*-m ?0?755", l))
    for binary in ("kregd", *sorted(helpers), "kregctl"):
      assert re.search(rf"\S*/{binary}\b", installs), (
          f"{where}: the install steps leave out {binary}")
    assert bindir in installs, f"{where}: does not install into {bindir}"
  # The operator guide builds what it installs.
  build = next(l for l in steps["docs/operator-guide.md"].replace(
      "\\\n", " ").splitlines() if "bazel build" in l)
  for target in ("//daemon/kregd:kregd", "//daemon/executor:kregd-probe",
                 "//daemon/executor:kregd-exec", "//daemon/kregd_compile:kregd-compile",
                 "//client/kregctl"):
    assert target in build, f"operator guide: bazel build lacks {target}"
  # ... and the compile service's headers, which kregd needs to start.
  for where in ("docs/operator-guide.md", "README.md"):
    assert "bazel-bin/daemon/kregd/include/xla/ffi/api/*.h" in steps[where], where


def test_no_doc_says_uid_isolation_is_the_default():
  # The default is isolation = "client" (daemon/config/config_fields.h).
  assert re.search(r'isolation = "client"',
                   (REPO / "daemon/config/config_fields.h").read_text())
  for path in [REPO / "README.md", REPO / "client/python/README.md",
               *(REPO / "docs").glob("*.md")]:
    text = " ".join(path.read_text().split())
    assert not re.search(r"\buid\W{0,3} \((the )?default\b", text), path
    assert "daemon-wide" not in text, path


def test_operator_guide_watching_bullets_are_not_garbled():
  # Every bullet of "Watching it" starts with "- " and no line repeats a
  # fragment of another bullet (a stray copy once followed `kregctl
  # sessions`).
  text = section(REPO / "docs/operator-guide.md", "Watching it")
  bullets = text.split("\n\n")[0].split("\n- ")
  for b in bullets:
    assert b.count("hosted FFI API") <= 1
  assert text.count("hosted FFI API") == 1


@pytest.fixture
def demo_module():
  import kernels_util as ku  # pylint: disable=import-outside-toplevel
  path = ku.kernels_dir() / "libdemo.so"
  if not path.is_file():
    pytest.skip(f"{path} not built")
  return path


def run_py(code: str, env: dict, cwd=None):
  return subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, env=env, cwd=cwd, timeout=300)


def test_user_guide_a_second_process_binds_by_name(running_kregd,
                                                   demo_module, tmp_path):
  guide = REPO / "docs/user-guide.md"
  register, bind = code_blocks(guide, "python")[:2]
  assert "kreg.register_ffi_target" in register and "bind_ffi_target" in bind
  register = register.replace("/opt/kernels/libdemo.so", str(demo_module))
  env = running_kregd.env()
  first = run_py(register, env, cwd=tmp_path)
  assert first.returncode == 0, first.stderr
  assert "[0. 2. 4. 6.]" in first.stdout
  # A second process that neither registers nor binds: XLA does not know
  # the name, with the message the guide quotes.
  call_only = "\n".join(l for l in bind.splitlines()
                        if "bind_ffi_target" not in l)
  unbound = run_py(call_only, env, cwd=tmp_path)
  assert unbound.returncode != 0
  assert ("NOT_FOUND: No FFI handler registered for demo.scale on a "
          "platform Host") in unbound.stderr
  assert "NOT_FOUND: No FFI handler registered for demo.scale" in " ".join(
      guide.read_text().split())
  second = run_py(bind, env, cwd=tmp_path)
  assert second.returncode == 0, second.stderr
  assert "[0. 2. 4. 6.]" in second.stdout


def test_readme_local_bind_and_export_examples_run_as_written(tmp_path):
  # The README's local-execution, bind-by-name and jax.export examples,
  # verbatim, from the repository root (their module path is relative to
  # it), each in a fresh process against a fresh kregd.
  pytest.importorskip("flatbuffers")
  from kregd_proc import finish_test_daemon, start_test_daemon  # pylint: disable=import-outside-toplevel
  blocks = code_blocks(REPO / "README.md", "python")
  local = [b for b in blocks if 'execution="local"' in b and "configure" in b]
  bind = [b for b in blocks if "kreg.bind_ffi_target(" in b]
  export = [b for b in blocks if "exp.serialize()" in b]
  run = [b for b in blocks if "kreg.bind_exported(exp)" in b]
  assert len(local) == len(bind) == len(export) == len(run) == 1
  d = start_test_daemon("kreg-readme-")
  try:
    env = d.env()
    for code in (local[0], bind[0], export[0]):
      r = run_py(code, env, cwd=REPO)
      assert r.returncode == 0, code + r.stderr
    r = run_py(run[0], env, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "[0. 2. 4. 6.]" in r.stdout
  finally:
    (REPO / "f.jax").unlink(missing_ok=True)
    finish_test_daemon(d)


def test_kernel_author_guide_example_builds_and_takes_a_python_float(
    running_kregd, tmp_path):
  if shutil.which("g++") is None:
    pytest.skip("no g++")
  guide = REPO / "docs/kernel-author-guide.md"
  (tmp_path / "mykernels.cc").write_text(code_blocks(guide, "cpp")[0])
  # The guide's block as written (it writes its exports.lds too), with the
  # Python that has jax.
  build = code_blocks(guide, "sh")[0]
  r = subprocess.run(["bash", "-euo", "pipefail", "-c", build], cwd=tmp_path,
                     capture_output=True, text=True, timeout=600,
                     env={**os.environ, "PYTHON": sys.executable})
  assert r.returncode == 0, r.stderr
  assert "warning" not in r.stderr, r.stderr
  assert re.search(r"\bT Scale$", r.stdout, re.M), r.stdout
  so = tmp_path / "libmykernels.so"
  # The README's call (factor=2.0, a Python float: F64) and np.float32.
  code = f"""
import jax, jax.numpy as jnp, numpy as np, kreg
kreg.register_ffi_target("docs.guide.scale", {str(so)!r}, "Scale", platform="cpu")
call = jax.ffi.ffi_call("docs.guide.scale", jax.ShapeDtypeStruct((4,), jnp.float32))
x = jnp.arange(4, dtype=jnp.float32)
print(call(x, factor=2.0), call(x, factor=np.float32(3.0)))
"""
  out = run_py(code, running_kregd.env(), cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  assert "[0. 2. 4. 6.] [0. 3. 6. 9.]" in out.stdout


def errors_md_row(starts_with: str) -> tuple[re.Pattern, int]:
  """The message of the docs/errors.md row whose message begins with
  `starts_with`, as a regex (`<...>` matches anything), and the kregctl exit
  status the row gives (`(N)` in its code column)."""
  for line in (REPO / "docs/errors.md").read_text().splitlines():
    cells = line.split(" | ")
    if len(cells) >= 3 and cells[0].startswith(f"| `{starts_with}"):
      message = re.match(r"\| `([^`]+)`", cells[0]).group(1)
      parts = re.split(r"<[^>]+>", message)
      exit_status = int(re.search(r"\((?:exit )?(\d)\)", cells[1]).group(1))
      return re.compile(".+?".join(map(re.escape, parts))), exit_status
  raise AssertionError(f"docs/errors.md has no row for {starts_with!r}")


@pytest.mark.parametrize("module,function,row", [
    ("libdemo.so", "scale", 'symbol "<f>" in module <m>: the module exports'),
    ("libstateful.so", "Stateful",
     'symbol "<f>" in module <m>: symbol failed XLA FFI'),
    ("libnot_handler.so", "NotAHandler",
     'symbol "<f>" in module <m>: symbol does not answer'),
])
def test_errors_md_registration_rows_are_what_kregctl_prints(
    running_kregd, kregctl_path, module, function, row):
  import kernels_util as ku  # pylint: disable=import-outside-toplevel
  path = ku.kernels_dir() / module
  if not path.is_file():
    pytest.skip(f"{path} not built")
  pattern, exit_status = errors_md_row(row)
  r = subprocess.run([str(kregctl_path), "--socket", running_kregd.socket,
                      "register", f"docs.errors.{function}", "--module",
                      str(path), "--function", function, "--platform", "cpu"],
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == exit_status, r.stderr
  assert pattern.search(r.stderr), (pattern.pattern, r.stderr)
  guide = " ".join((REPO / "docs/kernel-author-guide.md").read_text().split())
  if function == "Stateful":
    quoted = re.search(r'`(symbol "Stateful" in module [^`]+)`', guide)
    assert quoted, "kernel-author guide: no Stateful message"
    parts = quoted.group(1).split("…")
    assert re.search(".+?".join(map(re.escape, parts)), r.stderr), r.stderr


def test_python_spells_platforms_like_common_platforms_h():
  # One table of platforms (common/platforms.h) for kregd and the shim; the
  # Python client's copy must say the same.
  import re
  from kreg import _client  # pylint: disable=import-outside-toplevel
  header = (REPO / "common" / "platforms.h").read_text()
  table = header.split("kPlatforms[] = {", 1)[1].split("};", 1)[0]
  rows = re.findall(r'\{"([^"]+)", "([^"]+)", (?:"([^"]+)"|nullptr)\}', table)
  assert rows, table
  assert _client._PLATFORMS == {  # pylint: disable=protected-access
      name: (jax, alias or None) for name, jax, alias in rows}
  for name, jax, alias in rows:
    assert _client._canonical_platform(alias.upper()) == name
    assert _client._jax_platform(name) == jax


def test_readme_cluster_quick_start_runs_as_written():
  # The README's "Cluster mode on one machine", verbatim, from the
  # repository root against a real etcd: the listing through host2 names
  # host1, and other content under the name on host2 is refused naming
  # host1, as the README says.
  if shutil.which("etcd") is None:
    pytest.skip("etcd is not installed (tools/setup.sh installs it)")
  need(REPO / "bazel-bin/daemon/kregd/kregd")
  need(REPO / "bazel-bin/client/kregctl/kregctl")
  blocks = [b for b in code_blocks(REPO / "README.md", "sh")
            if "--cluster-key-file" in b]
  assert len(blocks) == 1, blocks
  script = blocks[0] + 'echo "QUICK=$q"\n'
  # Its own session: the background etcd and kregds are in the process
  # group killed at the end.
  p = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, start_new_session=True)
  q = None
  try:
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, out + err
    q = pathlib.Path(re.search(r"^QUICK=(.*)$", out, re.M).group(1))
    assert re.search(r"^registered demo\.scale \(cpu\) sha256:", out, re.M), out
    listing = [l for l in out.splitlines() if "demo.scale" in l]
    assert any("host1" in l for l in listing[1:]), out
    other = subprocess.run(
        [str(REPO / "bazel-bin/client/kregctl/kregctl"), "--socket",
         str(q / "h2/kregd.sock"), "register", "demo.scale", "--module",
         str(REPO / "bazel-bin/kernels/cpu/libdemo_v2.so"), "--function",
         "Scale", "--platform", "cpu"], capture_output=True, text=True,
        timeout=60)
    assert other.returncode == 3, other.stdout + other.stderr
    assert "host1" in other.stderr, other.stderr
  finally:
    try:
      os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
      pass
    p.wait(timeout=30)
    if q is not None:
      shutil.rmtree(q, ignore_errors=True)
