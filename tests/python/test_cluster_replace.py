"""replace=True in cluster mode (docs/replace.md §9), through a real etcd
(3 members) and three kregd "hosts" with `replace = "owner"`: a replacement
on host A is one compare-and-swap in etcd and every other host mirrors the
next generation (kregctl show, a new process there runs it); a host that
has not caught up is refused naming the generation that won; replacements
racing on two hosts never both take one generation; a host that restarts
reconciles its journal to etcd's generation; a host with a local entry etcd
does not hold is refused. A process on another host that holds the
target (isolated or local) switches to the new generation, without a
re-jit, when that host mirrors it, and the replacement returns only once
that host acknowledged it (etcd acks/); one that does not switch there
(SIGSTOPped), or a host that cannot take the generation while a process
there holds the target, makes the replacement fail DEADLINE_EXCEEDED
naming the pid and host.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import holder
import kernels_util as ku
from kregd_proc import Daemon, kregctl_binary
from cluster_harness import (EtcdCluster, digest_of, free_ports, kregctl,
                             listed, start_host, wait_for)
from test_cluster import store_file

# Padding that makes a build too large for host C's max_module_bytes: C
# then cannot fetch it and stays at the generation it has.
PAD = 1 << 16


def build(root: pathlib.Path, lib: str, tag: str, pad: int = 0
          ) -> pathlib.Path:
  """`lib` with `tag` (and `pad` zero bytes) appended: other bytes, same
  behaviour."""
  p = root / f"{lib}-{tag}.so"
  if not p.exists():
    p.write_bytes(ku.kernel_path(lib).read_bytes() + b"\0" * pad +
                  tag.encode())
  return p


@pytest.fixture(scope="module")
def cl():
  if kregctl_binary() is None:
    pytest.skip("kregctl not built (bazel build //client/kregctl)")
  root = pathlib.Path(tempfile.mkdtemp(prefix="kcr-", dir="/tmp"))
  etcd = EtcdCluster(root)
  hosts: list[Daemon] = []
  try:
    for i in range(3):
      etcd.start(i)
    etcd.wait_healthy()
    limit = ku.kernel_path("libdemo_v2.so").stat().st_size + PAD // 2
    ports = free_ports(3)
    for name, port in zip(("hostA", "hostB", "hostC"), ports):
      extra = ["--replace", "owner"]
      if name == "hostC":
        extra += ["--max-module-bytes", str(limit)]
      hosts.append(start_host(root, name, etcd.endpoints, port, *extra))
    ns = type("Cluster", (), {})()
    ns.root, ns.etcd = root, etcd
    # As the other hosts name them.
    ns.b_name, ns.c_name = (f"hostB (127.0.0.1:{ports[1]})",
                            f"hostC (127.0.0.1:{ports[2]})")
    ns.c_limit = limit
    ns.a, ns.b, ns.c = hosts
    yield ns
  finally:
    for d in hosts:
      d.stop()
    for i in range(3):
      etcd.kill(i)
    if os.environ.get("KREG_KEEP_TEST_DIRS") is None:
      shutil.rmtree(root, ignore_errors=True)


def register(host: Daemon, name: str, module: pathlib.Path, func: str,
             *extra) -> subprocess.CompletedProcess:
  return kregctl(host, "register", name, "--module", module, "--function",
                 func, "--platform", "cpu", *extra, timeout=120)


def show(host: Daemon, name: str) -> dict:
  out = kregctl(host, "show", name, "--json")
  assert out.returncode == 0, out.stderr
  [target] = json.loads(out.stdout)
  return target


def generation_on(host: Daemon, name: str, generation: int) -> dict:
  """Waits until `host` has `name` at `generation`; its `kregctl show`."""
  return wait_for(
      lambda: (lambda t: t if t.get("generation") == generation else None)(
          show(host, name) if (name, "cpu") in listed(host) else {}),
      60, f"{name} at generation {generation} on {host.root.name}")


def first_everywhere(cl, name: str) -> pathlib.Path:
  """Registers `name` (libdemo.so's Scale) on host A and waits until every
  host has generation 1."""
  v1 = build(cl.root, "libdemo.so", name)
  out = register(cl.a, name, v1, "Scale")
  assert out.returncode == 0, out.stderr
  for h in (cl.a, cl.b, cl.c):
    generation_on(h, name, 1)
  return v1


# Binds argv[1] (at generation argv[2], 0: the current one) in a new
# process on the host, calls it once (factor 2) and prints the result's
# bytes (hex).
CALL = """
import sys
import jax, numpy as np
import kreg
kreg.bind_ffi_target(sys.argv[1], platform="cpu",
                     generation=int(sys.argv[2]) or None)
x = (np.arange(256) % 10).astype(np.uint8)
y = jax.ffi.ffi_call(sys.argv[1], jax.ShapeDtypeStruct(x.shape, x.dtype))(
    x, factor=np.float32(2))
print(bytes(np.asarray(y)).hex())
"""

X = (np.arange(256) % 10).astype(np.uint8)
OLD = bytes(2 * X)  # libdemo.so's Scale
NEW = ku.attrs_digest_expected({"factor": np.float32(2)})  # v2's AttrsDigest


def call_on(host: Daemon, name: str, generation: int = 0) -> bytes:
  out = subprocess.run([sys.executable, "-c", textwrap.dedent(CALL), name,
                        str(generation)],
                       env=host.env(), capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr + host.log()
  return bytes.fromhex(out.stdout.strip().splitlines()[-1])


def test_a_replacement_on_one_host_is_the_next_generation_everywhere(cl):
  first_everywhere(cl, "rep.op")
  assert call_on(cl.b, "rep.op") == OLD
  v2 = build(cl.root, "libdemo_v2.so", "rep.op")
  out = register(cl.a, "rep.op", v2, "AttrsDigest", "--replace")
  assert out.returncode == 0, out.stderr
  a = show(cl.a, "rep.op")
  assert a["generation"] == 2
  b = generation_on(cl.b, "rep.op", 2)
  assert b["module_digest"] == digest_of(v2)
  assert b["func_name"] == "AttrsDigest"
  assert [g["generation"] for g in b["generations"]] == [1, 2]
  # The same history on both hosts; each counts its own calls.
  def history(t):
    return [{k: v for k, v in g.items() if k != "stats"}
            for g in t["generations"]]
  assert history(b) == history(a)
  assert b["host"].startswith("hostA (127.0.0.1:")
  assert ("cluster: target \"rep.op\" (cpu) replaced on host hostA" in
          cl.b.log(None))
  assert "CLUSTER CONFLICT" not in cl.b.log(None)
  # etcd's record carries the generations.
  got = cl.etcd.ctl("get", "--print-value-only",
                    "/kregd/default/targets/cpu/rep.op")
  record = json.loads(got.stdout.split("\n", 1)[1])
  assert record["generation"] == 2
  assert [g["generation"] for g in record["generations"]] == [1, 2]
  # A new process on host B runs generation 2 (its module fetched from A).
  assert call_on(cl.b, "rep.op").rstrip(b"\0") == NEW  # AttrsDigest pads
  # Generation 1 stays there for a pin (its module was mirrored before).
  assert call_on(cl.b, "rep.op", 1) == OLD


class Holder(holder.Holder):
  """holder.Holder on `host`, which knows what its host says it runs."""

  def __init__(self, host: Daemon, name: str, mode: str):
    super().__init__(host, name, mode)
    self.host, self.name = host, name

  def runs(self):
    """The generation its host's kregctl show says it runs."""
    for b in show(self.host, self.name).get("bound_by", []):
      if b["pid"] == self.pid:
        return b["generation"]
    return None


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_a_replacement_returns_once_a_holder_on_another_host_switched(cl,
                                                                     mode):
  name = f"rep.held-{mode}"
  first_everywhere(cl, name)
  h = Holder(cl.b, name, mode)
  try:
    assert h.call() == {"y": [0, 2, 4, 6], "traces": 1}
    v2 = build(cl.root, "libdemo_v2.so", name)  # Scale by factor + 1
    out = register(cl.a, name, v2, "Scale", "--replace")
    assert out.returncode == 0, out.stderr
    # B acknowledged before the replacement returned: its holder runs 2.
    assert show(cl.b, name)["generation"] == 2
    assert h.runs() == 2
    assert h.call() == {"y": [0, 3, 6, 9], "traces": 1}
  finally:
    h.end()


def kregd_sessions(host: Daemon) -> list:
  out = kregctl(host, "sessions", "--json")
  assert out.returncode == 0, out.stderr
  return json.loads(out.stdout)


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_a_stopped_holder_on_another_host_fails_the_replacement_naming_it(
    cl, mode):
  name = f"rep.stopped-{mode}"
  first_everywhere(cl, name)
  h = Holder(cl.b, name, mode)
  try:
    assert h.call() == {"y": [0, 2, 4, 6], "traces": 1}
    # Isolated: its executor acknowledges for it; local: the process does.
    stopped = h.pid
    if mode == "isolated":
      [stopped] = [s["executor_pid"] for s in kregd_sessions(cl.b)
                   if s["pid"] == h.pid and s["executor_pid"]]
    os.kill(stopped, signal.SIGSTOP)
    try:
      v2 = build(cl.root, "libdemo_v2.so", name)
      late = register(cl.a, name, v2, "Scale", "--replace")
      # Committed everywhere; B's holder is shown where it is.
      assert show(cl.b, name)["generation"] == 2
      assert h.runs() == 1
    finally:
      os.kill(stopped, signal.SIGCONT)
    assert late.returncode == 1, late.stderr  # DEADLINE_EXCEEDED
    user = pwd.getpwuid(os.geteuid()).pw_name
    assert late.stderr.strip() == (
        f'target "{name}" (cpu) is now generation 2, but these processes did '
        f"not switch to it within replace_timeout (10 s): pid {h.pid} uid "
        f"{os.geteuid()} ({user}) host {cl.b_name} ({mode}, runs generation "
        f"1). They run generation 1 until they switch or exit; `kregctl show "
        f"{name}` shows what each runs. A stopped process (SIGSTOP) switches "
        "when it continues.")
    # Continued, it switches (B sent the re-point before it stopped).
    wait_for(lambda: h.runs() == 2, 60, f"B's {mode} holder to switch")
    assert h.call() == {"y": [0, 3, 6, 9], "traces": 1}
  finally:
    h.end()


def test_a_host_that_cannot_take_the_generation_names_its_holders(cl):
  name = "rep.big"
  first_everywhere(cl, name)
  h = Holder(cl.c, name, "isolated")
  try:
    assert h.call() == {"y": [0, 2, 4, 6], "traces": 1}
    # Too large for host C to fetch: its holder keeps generation 1. (kregctl
    # names a digest of the module it uploaded by the file's name.)
    big = build(cl.root, "libdemo_v2.so", name, PAD)
    late = register(cl.a, name, big, "Scale", "--replace")
    assert late.returncode == 1, late.stderr  # DEADLINE_EXCEEDED
    assert late.stderr.strip() == (
        f'target "{name}" (cpu) is now generation 2, but host {cl.c_name} '
        "could not switch its processes: it could not take generation 2 (its "
        f'module could not be fetched: module "{big.name}" ({digest_of(big)}) '
        "is bound in "
        f"etcd with a size of {big.stat().st_size} bytes, more than this "
        f"kregd's max_module_bytes ({cl.c_limit}); not fetched. Raise "
        "max_module_bytes on this host if the module is legitimate), so its "
        f"processes pid {h.pid} keep generation 1. `kregctl show {name}` on a "
        "host shows what its processes run.")
    assert show(cl.c, name)["generation"] == 1
    assert generation_on(cl.b, name, 2)["module_digest"] == digest_of(big)
    assert h.call() == {"y": [0, 2, 4, 6], "traces": 1}
  finally:
    h.end()


def test_a_host_that_has_not_caught_up_is_refused_naming_the_winner(cl):
  first_everywhere(cl, "rep.stale")
  # Host A's build is too large for host C to fetch: C stays at 1.
  big = build(cl.root, "libdemo_v2.so", "rep.stale-big", PAD)
  out = register(cl.a, "rep.stale", big, "AttrsDigest", "--replace")
  assert out.returncode == 0, out.stderr
  wait_for(lambda: "rep.stale" in cl.c.log(None) and
           "max_module_bytes" in cl.c.log(None), 60, "C to skip it")
  generation_on(cl.b, "rep.stale", 2)
  c = show(cl.c, "rep.stale")
  assert c["generation"] == 1
  mine = build(cl.root, "libdemo_v2.so", "rep.stale-c")
  lost = register(cl.c, "rep.stale", mine, "AttrsDigest", "--replace")
  assert lost.returncode == 1, lost.stderr  # ABORTED
  host_a = show(cl.a, "rep.stale")["host"]
  assert lost.stderr.strip() == (
      f'cannot replace target "rep.stale" (cpu): generation 1 (content '
      f"{c['content_id']}), which this host holds, is no longer its cluster "
      f"binding: generation 2 (content {digest_of(big)}, module "
      f"{digest_of(big)}) was made on host {host_a} by uid {os.geteuid()}. "
      "This host catches up shortly; check with kregctl show, then retry "
      "the replacement if your build should still replace that generation")
  # Nothing of the refused build stays on C; etcd keeps A's generation.
  assert show(cl.c, "rep.stale")["generation"] == 1
  assert not store_file(cl.c, digest_of(mine)).exists()
  assert show(cl.b, "rep.stale")["module_digest"] == digest_of(big)


def test_racing_replacements_never_share_a_generation(cl):
  first_everywhere(cl, "rep.race")
  builds = {h: build(cl.root, "libdemo_v2.so", f"rep.race-{h.root.name}")
            for h in (cl.a, cl.b)}
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = dict(zip(builds, pool.map(
        lambda h: register(h, "rep.race", builds[h], "AttrsDigest",
                           "--replace"), builds)))
  won = [h for h, r in results.items() if r.returncode == 0]
  assert won, [r.stderr for r in results.values()]
  for h, r in results.items():
    if r.returncode != 0:
      assert r.returncode == 1, r.stderr
      assert "which this host holds, is no longer its cluster binding: " \
             "generation 2" in r.stderr, r.stderr
  # One generation per winner; every host ends at the last one.
  last = 1 + len(won)
  final = generation_on(cl.a, "rep.race", last)
  assert generation_on(cl.b, "rep.race", last)["module_digest"] == \
      final["module_digest"]
  # Generation 1 is dropped by a second replacement (no process holds it:
  # docs/replace.md section 2).
  assert [g["generation"] for g in final["generations"]] == list(
      range(max(1, last - 1), last + 1))
  assert {g["module_digest"] for g in final["generations"]
          if g["generation"] > 1} == {digest_of(builds[h]) for h in won}


def test_a_restarted_host_reconciles_to_etcds_generation(cl):
  first_everywhere(cl, "rep.back")
  cl.b.stop()
  # While B is away, A makes generations 2 (v2's AttrsDigest) and 3
  # (libdemo.so's Scale again, another build).
  v2 = build(cl.root, "libdemo_v2.so", "rep.back")
  v3 = build(cl.root, "libdemo.so", "rep.back-3")
  for module, func in ((v2, "AttrsDigest"), (v3, "Scale")):
    out = register(cl.a, "rep.back", module, func, "--replace")
    assert out.returncode == 0, out.stderr
  cl.b.start()
  # B's journal has generation 1; etcd has 3.
  b = generation_on(cl.b, "rep.back", 3)
  assert b["module_digest"] == digest_of(v3)
  # Generation 1, held by no process when 3 was made, was dropped.
  assert [g["generation"] for g in b["generations"]] == [2, 3]
  assert call_on(cl.b, "rep.back") == OLD
  # Generation 2's module was fetched too: a pin to it runs there.
  wait_for(lambda: store_file(cl.b, digest_of(v2)).exists(), 60,
           "generation 2's module on B")
  assert call_on(cl.b, "rep.back", 2).rstrip(b"\0") == NEW
  # A restart with nothing new keeps generation 3 (journal, then etcd).
  cl.b.stop()
  cl.b.start()
  assert show(cl.b, "rep.back")["generation"] == 3
  assert "CLUSTER CONFLICT" not in cl.b.log(None)


def test_a_local_entry_etcd_does_not_hold_is_not_replaced(cl):
  c = cl.c
  c.stop()
  alone = Daemon(c.root, c.allow_roots, ["--replace", "owner"])
  alone.log_path = c.root / "standalone.log"
  alone.start()
  try:
    assert register(alone, "rep.local", build(cl.root, "libdemo.so",
                                              "rep.local"),
                    "Scale").returncode == 0
  finally:
    alone.stop()
  c.start()
  entry = show(c, "rep.local")
  out = register(c, "rep.local", build(cl.root, "libdemo_v2.so", "rep.local"),
                 "AttrsDigest", "--replace")
  assert out.returncode == 3, out.stderr
  assert out.stderr.strip() == (
      'cannot replace target "rep.local" (cpu): the cluster registry of '
      'cluster "default" holds no binding of it, so generation 1 is not the '
      "cluster's to replace. Retire it on this host (kregctl retire "
      "rep.local), then register the new build without replace=True")
  assert show(c, "rep.local")["content_id"] == entry["content_id"]
  assert kregctl(c, "retire", "rep.local").returncode == 0


def test_without_etcd_quorum_a_replacement_changes_nothing(cl):
  first_everywhere(cl, "rep.down")
  v2 = build(cl.root, "libdemo_v2.so", "rep.down")
  cl.etcd.kill(0)
  cl.etcd.kill(1)
  try:
    out = register(cl.a, "rep.down", v2, "AttrsDigest", "--replace")
    assert out.returncode == 4, out.stderr  # UNAVAILABLE
    assert out.stderr.startswith(
        'cannot replace target "rep.down" (cpu): the cluster registry of '
        'cluster "default" is unreachable ('), out.stderr
    assert out.stderr.strip().endswith(
        "). A generation is made in etcd for every host or not at all; "
        "generation 1 stays. Retry once etcd is back; should etcd have "
        "applied this replacement before its answer was lost, the retry "
        "completes it"), out.stderr
    assert show(cl.a, "rep.down")["generation"] == 1
    assert not store_file(cl.a, digest_of(v2)).exists()
  finally:
    cl.etcd.start(0)
    cl.etcd.start(1)
    cl.etcd.wait_healthy()
  # etcd back: the replacement goes through (a retry while etcd elects a
  # leader may time out first).
  wait_for(lambda: register(cl.a, "rep.down", v2, "AttrsDigest",
                            "--replace").returncode == 0, 60,
           "the replacement to go through")
  generation_on(cl.b, "rep.down", 2)
