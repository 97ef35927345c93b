"""Cluster mode (DESIGN §10): one registry for every host, in etcd.

A real 3-member etcd cluster (Debian's etcd-server binaries, own data dirs,
free loopback ports) and three kregd "hosts" (own state dirs, sockets and
peer ports) on this machine. Checks: concurrent conflicting registrations on
different hosts give one winner cluster-wide; a JAX process on each host
gets identical results with the module fetched from a peer; losing one etcd
member changes nothing, losing quorum keeps known targets working and fails
new registrations clearly, and registration resumes once etcd is back; a
peer serving wrong bytes is refused; retirement goes through etcd; restart
reconciles the journal with etcd; TLS between hosts is required when
configured.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import hmac
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from cluster_harness import (ETCD, ETCDCTL, EtcdCluster, cluster_key,
                             digest_of, free_ports, kregctl, listed,
                             start_host, variant, wait_for)
from kregd_proc import Daemon, kregctl_binary

if ETCD is None or ETCDCTL is None:
  if os.environ.get("CI"):
    raise RuntimeError("etcd/etcdctl missing in CI: tools/setup.sh installs "
                       "etcd-server and etcd-client")
  pytest.skip("etcd and etcdctl not installed (apt-get install etcd-server "
              "etcd-client, or run tools/setup.sh)", allow_module_level=True)


def store_file(host: Daemon, digest: str) -> pathlib.Path:
  return pathlib.Path(host.state_dir) / "modules" / (
      "sha256-" + digest.split(":", 1)[1] + ".so")


@pytest.fixture(scope="module")
def cluster():
  if kregctl_binary() is None:
    pytest.skip("kregctl not built (bazel build //client/kregctl)")
  root = pathlib.Path(tempfile.mkdtemp(prefix="kc-", dir="/tmp"))
  etcd = EtcdCluster(root)
  hosts: dict[str, Daemon] = {}
  try:
    for i in range(3):
      etcd.start(i)
    etcd.wait_healthy()
    ports = free_ports(3)
    for name, port in zip(("hostA", "hostB", "hostC"), ports):
      hosts[name] = start_host(root, name, etcd.endpoints, port)
    ns = type("Cluster", (), {})()
    ns.root, ns.etcd, ns.hosts, ns.ports = root, etcd, hosts, dict(
        zip(("hostA", "hostB", "hostC"), ports))
    ns.a, ns.b, ns.c = hosts["hostA"], hosts["hostB"], hosts["hostC"]
    yield ns
  finally:
    for d in hosts.values():
      d.stop()
    for i in range(3):
      etcd.kill(i)
    if os.environ.get("KREG_KEEP_TEST_DIRS") is None:
      shutil.rmtree(root, ignore_errors=True)


def register(host: Daemon, name: str, module: pathlib.Path, *extra,
             timeout=60):
  return kregctl(host, "register", name, "--module", module, "--function",
                 "Scale", "--platform", "cpu", *extra, timeout=timeout)


def test_concurrent_conflicting_registrations_have_one_winner(cluster):
  hosts = [cluster.a, cluster.b, cluster.c]
  jobs = [(hosts[i % 3], variant(cluster.root, f"race{i}")) for i in range(9)]
  with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
    results = list(pool.map(lambda j: register(j[0], "race.op", j[1]), jobs))
  winners = [(j, r) for j, r in zip(jobs, results) if r.returncode == 0]
  assert len(winners) == 1, [(r.returncode, r.stdout, r.stderr)
                             for r in results]
  (win_host, win_module), _ = winners[0]
  win_digest = digest_of(win_module)
  win_name = pathlib.Path(win_host.root).name
  for r in results:
    if r.returncode != 0:
      # The local refusal, naming the host and uid of the first one.
      assert r.returncode == 3, r.stderr
      assert "is already registered" in r.stderr
      assert f"first registered on host {win_name} (127.0.0.1:" in r.stderr
      assert f"by uid {os.geteuid()}" in r.stderr
      assert win_digest in r.stderr
  # Every host binds the winner's module (mirrored through the watch).
  for h in hosts:
    wait_for(lambda: listed(h).get(("race.op", "cpu"), {}).get(
        "module_digest") == win_digest, 30, f"race.op on {h.root.name}")
  # An equal registration anywhere is a no-op.
  for h in hosts:
    again = register(h, "race.op", win_module)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("already registered"), again.stdout
  cl = kregctl(cluster.b, "list", "--cluster", "--json")
  assert cl.returncode == 0, cl.stderr
  (entry,) = [t for t in json.loads(cl.stdout) if t["target_name"] == "race.op"]
  assert entry["module_digest"] == win_digest
  assert entry["host"].startswith(win_name + " (127.0.0.1:")


JAX_CALL = """
import json, pathlib, sys
import jax, jax.numpy as jnp, numpy as np, kreg
data = pathlib.Path(sys.argv[1]).read_bytes()
r = kreg.register_ffi_target("fetch.scale", data, "Scale", platform="cpu",
                             content_id="demo-build-1")
f = jax.jit(lambda x: jax.ffi.ffi_call(
    "fetch.scale", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=3.0))
out = np.asarray(f(jnp.arange(16, dtype=jnp.float32))).tolist()
listed = {t.target_name: t.host for t in kreg.list_registered_targets()}
print(json.dumps({"created": r.created, "digest": r.target.module_digest,
                  "out": out, "host": r.target.host,
                  "listed_host": listed["fetch.scale"]}))
"""


def jax_on(host: Daemon, module: pathlib.Path) -> dict:
  out = subprocess.run([sys.executable, "-c", JAX_CALL, str(module)],
                       env=host.env(), capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr + host.log()
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_jax_on_each_host_same_results_with_module_from_a_peer(cluster):
  # Host A's build registers first; B and C bring their own builds of the
  # same source (same content_id, other bytes): every host runs A's module,
  # fetched from a peer and verified.
  first = variant(cluster.root, "buildA")
  a = jax_on(cluster.a, first)
  assert a["created"] is True
  assert a["digest"] == digest_of(first)
  host_a = f"hostA (127.0.0.1:{cluster.ports['hostA']})"
  assert a["host"] == a["listed_host"] == host_a, a
  for name, h in (("buildB", cluster.b), ("buildC", cluster.c)):
    own = variant(cluster.root, name)
    got = jax_on(h, own)
    assert got["created"] is False
    assert got["digest"] == digest_of(first)
    assert got["host"] == got["listed_host"] == host_a, got
    assert got["out"] == a["out"] == [3.0 * i for i in range(16)]
    assert store_file(h, digest_of(first)).read_bytes() == first.read_bytes()
    assert not store_file(h, digest_of(own)).exists()
    assert f"fetched module {digest_of(first)}" in h.log(None)
  hosts = kregctl(cluster.a, "hosts", "--json")
  assert hosts.returncode == 0, hosts.stderr
  table = {h["host_name"]: h for h in json.loads(hosts.stdout)}
  assert set(table) == {"hostA", "hostB", "hostC"}
  for name, h in table.items():
    assert h["address"] == f"127.0.0.1:{cluster.ports[name]}"
    assert 0 < h["lease_ttl_s"] <= 10
    assert h["self"] == (name == "hostA")
  # The held-modules list is republished after each change.
  wait_for(lambda: all(
      digest_of(first) in h["modules"] for h in json.loads(
          kregctl(cluster.a, "hosts", "--json").stdout)), 15, "modules held")
  text = kregctl(cluster.c, "hosts")
  assert text.returncode == 0 and "(this kregd)" in text.stdout


def test_hosts_lists_a_registered_module_right_after_registration(cluster):
  # The host record is republished once the module is committed here, not
  # at the claim (before it): `kregctl hosts` shows it at once, not at the
  # next keep-alive (lease TTL / 3, 3.3 s).
  mod = variant(cluster.root, "hosts-count")
  mine = lambda: {h["host_name"]: h for h in json.loads(
      kregctl(cluster.b, "hosts", "--json").stdout)}["hostB"]
  before = len(mine()["modules"])
  t0 = time.monotonic()
  assert register(cluster.b, "hosts.count", mod).returncode == 0
  host = wait_for(lambda: (lambda h: h if digest_of(mod) in h["modules"]
                           else None)(mine()), 2.0,
                  "kregctl hosts to list the module just registered")
  assert len(host["modules"]) == before + 1
  assert time.monotonic() - t0 < 20
  text = kregctl(cluster.b, "hosts")
  assert text.returncode == 0
  [row] = [l for l in text.stdout.splitlines() if "hostB" in l]
  assert str(before + 1) in row.split(), text.stdout


def test_three_hosts_compile_one_source_once(cluster, tmp_path):
  # DESIGN §13: the three hosts compile the same sources at once; one host
  # compiles, the other two find its record in etcd and fetch the module
  # from it (digest verified), so every host registers the same bytes.
  if shutil.which("g++") is None:
    pytest.skip("no g++")
  src = tmp_path / "k.cc"
  src.write_text(f"// {os.getpid()} {time.time()}\n" + textwrap.dedent("""
      #include "xla/ffi/api/ffi.h"
      namespace ffi = xla::ffi;
      static ffi::Error Twice(ffi::Buffer<ffi::F32> x,
                             ffi::ResultBuffer<ffi::F32> y) {
        for (size_t i = 0; i < x.element_count(); ++i)
          y->typed_data()[i] = 2 * x.typed_data()[i];
        return ffi::Error::Success();
      }
      XLA_FFI_DEFINE_HANDLER_SYMBOL(TwiceHandler, Twice,
          ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>()
                          .Ret<ffi::Buffer<ffi::F32>>());
      """))
  hosts = [cluster.a, cluster.b, cluster.c]
  before = {h.socket: h.status() for h in hosts}
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    results = list(pool.map(
        lambda h: kregctl(h, "compile", "cc.cluster", "TwiceHandler", src,
                          "--json", timeout=300), hosts))
  outs = []
  for h, r in zip(hosts, results):
    assert r.returncode == 0, r.stderr + h.log()
    outs.append(json.loads(r.stdout))
  assert len({o["cache_key"] for o in outs}) == 1
  assert len({o["target"]["module_digest"] for o in outs}) == 1
  after = {h.socket: h.status() for h in hosts}
  compiled = sum(after[h.socket]["compiles"] - before[h.socket]["compiles"]
                 for h in hosts)
  fetched = sum(after[h.socket]["compile_peer_fetches"] -
                before[h.socket]["compile_peer_fetches"] for h in hosts)
  assert compiled == 1 and fetched == 2, (after, [h.log() for h in hosts])
  digest = outs[0]["target"]["module_digest"]
  for h in hosts:
    assert store_file(h, digest).is_file()
  # Another name with the same sources on a host that fetched: no compile.
  fetcher = next(h for h in hosts
                 if after[h.socket]["compiles"] == before[h.socket]["compiles"])
  r = kregctl(fetcher, "compile", "cc.cluster.again", "TwiceHandler", src,
              "--json")
  assert r.returncode == 0, r.stderr
  again = json.loads(r.stdout)
  assert again["cache_hit"] is True
  assert fetcher.status()["compiles"] == after[fetcher.socket]["compiles"]
  # kreg.compile_ffi_target reads the same answer, the binding's host too.
  import kreg  # pylint: disable=import-outside-toplevel
  reg = kreg.Client(fetcher.socket).compile_ffi_target(
      "cc.cluster.py", {"k.cc": src.read_text()}, "TwiceHandler")
  assert reg.created and reg.cache_hit and reg.cache_key == again["cache_key"]
  assert " (127.0.0.1:" in reg.target.host
  assert reg.target.host == again["target"]["host"], again


def test_retirement_goes_through_etcd(cluster):
  m1, m2 = variant(cluster.root, "ret1"), variant(cluster.root, "ret2")
  assert register(cluster.a, "ret.op", m1).returncode == 0
  for h in (cluster.b, cluster.c):
    wait_for(lambda: ("ret.op", "cpu") in listed(h), 30, "ret.op mirrored")
  out = kregctl(cluster.b, "retire", "ret.op", "--platform", "cpu")
  assert out.returncode == 0, out.stderr
  for h in (cluster.a, cluster.b, cluster.c):
    wait_for(lambda: ("ret.op", "cpu") not in listed(h), 30, "ret.op gone")
  # Not deleted: a signed retirement (a bare delete retires nothing).
  tomb = cluster.etcd.ctl("get", "--print-value-only",
                          "/kregd/default/targets/cpu/ret.op").stdout
  assert tomb.startswith("kreg-sig-v2 retire "), tomb
  assert "ret.op" not in kregctl(cluster.a, "list", "--cluster").stdout
  again = register(cluster.c, "ret.op", m2)
  assert again.returncode == 0, again.stderr
  assert again.stdout.startswith("registered"), again.stdout


def reserved(host: Daemon) -> dict:
  out = kregctl(host, "reserve", "--json")
  assert out.returncode == 0, out.stderr
  return {r["pattern"]: r["owner"] for r in json.loads(out.stdout)}


def test_name_reservations_hold_on_every_host(cluster):
  hosts = (cluster.a, cluster.b, cluster.c)
  made = kregctl(cluster.a, "reserve", "team.*", "--owner", "65534")
  assert made.returncode == 0, made.stderr
  for h in hosts:
    wait_for(lambda: reserved(h).get("team.*", "").startswith("uid 65534"),
             30, "the reservation on every host")
  key = "/kregd/default/reservations/team.*"
  get = lambda: cluster.etcd.ctl("get", "--print-value-only",
                                 key).stdout.rstrip("\n")
  record = get()
  assert record.startswith("kreg-sig-v2 reserve "), record
  # A host that was away gets it when it syncs with etcd.
  synced = cluster.c.log(None).count("in sync with etcd")
  cluster.c.stop()
  cluster.c.start()
  wait_for(lambda: cluster.c.log(None).count("in sync with etcd") > synced,
           30, "host C to sync")
  assert "team.*" in reserved(cluster.c)
  # Neither a bare delete nor a record without the cluster key lifts it.
  assert cluster.etcd.ctl("del", key).returncode == 0
  # Put back for the key's new incarnation (signed for its new place).
  body = lambda v: v.split("\n", 1)[-1]
  wait_for(lambda: get() != record and body(get()) == body(record), 30,
           "the record put back")
  forged = record.split("\n", 1)[1].replace('"pattern"', '"lifted":true,'
                                            '"pattern"')
  assert cluster.etcd.ctl("put", key, forged).returncode == 0
  for h in hosts:
    wait_for(lambda: f'etcd key "{key}" holds a record without a kregd '
             "signature" in h.log(None), 30, "the forged lifting ignored")
    assert "team.*" in reserved(h)
  # Lifted on another host: gone everywhere.
  lifted = kregctl(cluster.b, "reserve", "team.*", "--lift")
  assert lifted.returncode == 0, lifted.stderr
  for h in hosts:
    wait_for(lambda: "team.*" not in reserved(h), 30, "lifted everywhere")
  assert get().startswith("kreg-sig-v2 reserve ")


def sign(key: bytes, etcd_key: str, kind: str, body: bytes,
         create_revision: int = 0, version: int = 1) -> bytes:
  """A record as kregd signs it (daemon/cluster/record_signer.h), for its
  place in the key's history."""
  k = etcd_key.encode()
  place = f"{create_revision}\n{version}\n".encode()
  mac = hmac.new(key, b"kreg-sig-v2 " + kind.encode() + b"\n" + place +
                 str(len(k)).encode() + b"\n" + k + body,
                 hashlib.sha256).hexdigest()
  return (b"kreg-sig-v2 " + kind.encode() + b" " +
          f"{create_revision} {version} ".encode() + mac.encode() + b"\n" +
          body)


def sign_v1(key: bytes, etcd_key: str, kind: str, body: bytes) -> bytes:
  """A record as kregd signed it before records were bound to their place
  (format kreg-sig-v1): refused."""
  k = etcd_key.encode()
  mac = hmac.new(key, b"kreg-sig-v1 " + kind.encode() + b"\n" +
                 str(len(k)).encode() + b"\n" + k + body,
                 hashlib.sha256).hexdigest()
  return b"kreg-sig-v1 " + kind.encode() + b" " + mac.encode() + b"\n" + body


def the_cluster_key(cluster) -> bytes:
  return cluster_key(cluster.root).read_text().strip().encode()


def etcd_raw(cluster, key: str):
  """`key`'s value (exact bytes) and its place, or (None, None) when absent."""
  out = cluster.etcd.ctl("get", key, "-w", "json")
  assert out.returncode == 0, out.stderr
  kvs = json.loads(out.stdout).get("kvs", [])
  if not kvs:
    return None, None
  kv = kvs[0]
  return (base64.b64decode(kv.get("value", "")),
          (int(kv["create_revision"]), int(kv["version"])))


def etcd_put(cluster, key: str, value: bytes) -> None:
  put = subprocess.run([ETCDCTL, "--endpoints", cluster.etcd.endpoints,
                        "put", key], input=value, capture_output=True,
                       timeout=20, env={**os.environ, "ETCDCTL_API": "3"})
  assert put.returncode == 0, put.stderr


def test_forged_records_in_etcd_are_ignored(cluster):
  # Whoever can write to etcd (etcdctl) but lacks the cluster key can
  # neither re-bind nor retire another user's binding.
  hosts = (cluster.a, cluster.b, cluster.c)
  mine, theirs = variant(cluster.root, "victim"), variant(cluster.root, "atk")
  assert register(cluster.a, "vic.op", mine).returncode == 0
  assert register(cluster.b, "atk.op", theirs).returncode == 0
  for h in hosts:
    wait_for(lambda: {("vic.op", "cpu"), ("atk.op", "cpu")} <= set(listed(h)),
             30, "vic.op and atk.op everywhere")
  key = "/kregd/default/targets/cpu/vic.op"
  get = lambda k: cluster.etcd.ctl("get", "--print-value-only", k).stdout
  original = get(key).rstrip("\n")
  assert original.startswith("kreg-sig-v2 bind "), original
  body = json.loads(original.split("\n", 1)[1])
  body["module_digest"] = digest_of(theirs)
  forged = json.dumps(body).encode()

  def still_mine(what):
    for h in hosts:
      assert listed(h)[("vic.op", "cpu")]["module_digest"] == \
          digest_of(mine), what

  # A bare delete retires nothing; the signed record is put back (signed
  # for the key's new incarnation).
  assert cluster.etcd.ctl("del", key).returncode == 0
  body_of = lambda v: v.split("\n", 1)[-1]
  wait_for(lambda: get(key).rstrip("\n") != original and
           body_of(get(key).rstrip("\n")) == body_of(original), 30,
           "record restored")
  for h in hosts:
    wait_for(lambda: f'etcd key "{key}" was deleted, but a binding is '
             "retired only by a signed retirement" in h.log(None), 30,
             "the delete to be ignored")
  still_mine("after etcdctl del")
  other_key = os.urandom(32).hex().encode()
  moved = get("/kregd/default/targets/cpu/atk.op").rstrip("\n")
  for value, why in (
      (forged, "without a kregd signature"),
      (b"kreg-sig-v2 bind 1 2 " + b"0" * 64 + b"\n" + forged, "bad signature"),
      (sign(other_key, key, "bind", forged), "bad signature"),
      (sign(other_key, key, "retire", forged), "bad signature"),
      (moved.encode(), "bad signature"),
      # Signed with the cluster key in the format before places.
      (sign_v1(the_cluster_key(cluster), key, "bind", forged),
       "holds a record of the earlier format kreg-sig-v1")):
    before = [h.log(None).count(why) for h in hosts]
    put = subprocess.run([ETCDCTL, "--endpoints", cluster.etcd.endpoints,
                          "put", key], input=value, capture_output=True,
                         timeout=20, env={**os.environ, "ETCDCTL_API": "3"})
    assert put.returncode == 0, put.stderr
    for h, n in zip(hosts, before):
      wait_for(lambda: h.log(None).count(why) > n, 30, f"{why} logged")
      assert f'ignored what etcd holds: etcd key "{key}"' in h.log(None)
    still_mine(value[:40])
  # A fresh bind of the victim's module is its own binding; the
  # attacker's module under that name is refused.
  again = register(cluster.c, "vic.op", mine)
  assert again.returncode == 0 and "already registered" in again.stdout
  assert register(cluster.c, "vic.op", theirs).returncode != 0
  # A restart reconciles with the forged record in etcd: kept all the same.
  synced = cluster.c.log(None).count("in sync with etcd")
  cluster.c.stop()
  cluster.c.start()
  wait_for(lambda: cluster.c.log(None).count("in sync with etcd") > synced,
           30, "host C to sync")
  still_mine("after a restart")
  # etcd's record back as kregd wrote it (a replay of the same binding).
  assert cluster.etcd.ctl("put", key, original).returncode == 0
  for h in hosts:
    assert kregctl(h, "list", "--cluster").returncode == 0
  kregctl(cluster.a, "retire", "vic.op")
  kregctl(cluster.b, "retire", "atk.op")


def test_a_claim_left_unsealed_is_taken_over_after_the_grace(cluster):
  # docs/design.md §10: a host that claims a name and dies before sealing
  # its claim holds the name for kClaimGraceMs (3 s), no longer. The claim
  # here is signed with the cluster key as a kregd's creating write, and
  # never sealed.
  hosts = (cluster.a, cluster.b, cluster.c)
  key = "/kregd/default/targets/cpu/orphan.op"
  claim = sign(the_cluster_key(cluster), key, "bind",
               b'{"name": "orphan.op", "host": "gone (127.0.0.9:1)"}')
  etcd_put(cluster, key, claim)
  value, place = etcd_raw(cluster, key)
  assert value == claim and place[1] == 1
  module = variant(cluster.root, "orphan")
  mark = len(cluster.b.log(None))
  started = time.monotonic()
  out = register(cluster.b, "orphan.op", module)
  took = time.monotonic() - started
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith("registered"), out.stdout
  # Not before the grace: host B saw the claim after the call began.
  assert took >= 3.0, took
  log = cluster.b.log(None)[mark:]
  assert ('cluster: taking over the claim of target "orphan.op" (cpu) in '
          "etcd") in log, log[-2000:]
  assert ("did not seal its claim within 3000 ms (it died or lost etcd "
          "between claim and seal), so that claim counts for nothing") in log
  # etcd holds host B's sealed binding, the key's next version.
  value, place = etcd_raw(cluster, key)
  assert value.startswith(b"kreg-sig-v2 bind ") and place[1] == 2, value[:80]
  assert digest_of(module).encode() in value
  for h in hosts:
    wait_for(lambda: listed(h).get(("orphan.op", "cpu"), {}).get(
        "module_digest") == digest_of(module), 30, "orphan.op everywhere")
  assert kregctl(cluster.b, "retire", "orphan.op").returncode == 0


def wait_synced(host: Daemon, before: int = 0) -> None:
  wait_for(lambda: host.log(None).count("in sync with etcd") > before, 60,
           f"{host.root.name} to sync with etcd")


def test_replayed_binding_record_is_ignored(cluster):
  # docs/design.md §10, "Records cannot be replayed": someone who can
  # write to etcd (no cluster key) saves its own signed binding of a name,
  # retires it, waits for another registration of the name, then puts the
  # old record back.
  hosts = (cluster.a, cluster.b, cluster.c)
  old, new = variant(cluster.root, "rpl-old"), variant(cluster.root, "rpl-new")
  key = "/kregd/default/targets/cpu/rpl.op"
  digest = lambda h: listed(h).get(("rpl.op", "cpu"), {}).get("module_digest")
  assert register(cluster.a, "rpl.op", old).returncode == 0
  for h in hosts:
    wait_for(lambda: digest(h) == digest_of(old), 30, "rpl.op everywhere")
  saved, saved_at = etcd_raw(cluster, key)
  assert saved.startswith(b"kreg-sig-v2 bind "), saved
  assert kregctl(cluster.a, "retire", "rpl.op").returncode == 0
  for h in hosts:
    wait_for(lambda: digest(h) is None, 30, "rpl.op retired everywhere")
  again = register(cluster.b, "rpl.op", new)
  assert again.returncode == 0 and again.stdout.startswith("registered"), \
      again.stdout + again.stderr
  for h in hosts:
    wait_for(lambda: digest(h) == digest_of(new), 30, "the new rpl.op")
  bound, bound_at = etcd_raw(cluster, key)
  assert bound_at[0] == saved_at[0] and bound_at[1] > saved_at[1]

  before = [h.log(None).count("holds a replayed bind record") for h in hosts]
  conflicts = [h.log(None).count("CLUSTER CONFLICT") for h in hosts]
  etcd_put(cluster, key, saved)
  replayed = (f'ignored what etcd holds: etcd key "{key}" holds a replayed '
              f"bind record: it was signed for version {saved_at[1]} of the "
              f"key as created at revision {saved_at[0]}, but the key is at "
              f"version {bound_at[1] + 1}")
  for h, n in zip(hosts, before):
    wait_for(lambda: h.log(None).count("holds a replayed bind record") > n,
             30, "the replay logged")
    assert replayed in h.log(None), h.log(4000)
  # The record it overwrote is put back, signed for its new place.
  wait_for(lambda: etcd_raw(cluster, key)[0].split(b"\n", 1)[1] ==
           bound.split(b"\n", 1)[1] and
           etcd_raw(cluster, key)[1][1] > bound_at[1] + 1, 30,
           "the new binding put back in etcd")
  assert any(f'put the bind record of etcd key "{key}" back' in h.log(None)
             for h in hosts)
  for h, n in zip(hosts, conflicts):
    assert digest(h) == digest_of(new)
    assert h.log(None).count("CLUSTER CONFLICT") == n, h.log(4000)
  # A host that starts afterwards binds the new module, never the old.
  d = start_host(cluster.root, "replayD", cluster.etcd.endpoints,
                 free_ports(1)[0])
  try:
    wait_synced(d)
    wait_for(lambda: digest(d) == digest_of(new), 30, "rpl.op on a new host")
    # Replayed again while it runs, after etcd compacted its history (the
    # check reads the key's place, never its history): ignored there too.
    # The other hosts are stopped meanwhile, so that none of them puts the
    # record back before this host has seen the replay (on a loaded
    # machine its watch, or the re-read after a compacted watch, may come
    # after such a put-back, which leaves nothing to log).
    synced = [h.log(None).count("in sync with etcd") for h in hosts]
    for h in hosts:
      h.stop()
    try:
      out = cluster.etcd.ctl("get", key, "-w", "json")
      revision = json.loads(out.stdout)["header"]["revision"]
      compact = cluster.etcd.ctl("compact", str(revision))
      assert compact.returncode == 0, compact.stderr
      n = d.log(None).count("holds a replayed bind record")
      etcd_put(cluster, key, saved)
      wait_for(lambda: d.log(None).count("holds a replayed bind record") > n,
               30, "the replay logged on the new host")
      assert digest(d) == digest_of(new)
    finally:
      for h, before in zip(hosts, synced):
        h.start()
        wait_synced(h, before)
    # And at its next start, with whatever etcd holds then.
    synced = d.log(None).count("in sync with etcd")
    d.stop()
    d.start()
    wait_synced(d, synced)
    assert digest(d) == digest_of(new)
  finally:
    d.stop()
  for h in hosts:
    assert digest(h) == digest_of(new)
  kregctl(cluster.b, "retire", "rpl.op")


def test_replayed_lifting_is_ignored(cluster):
  # The same with a signed lifting of a reservation that was set again.
  hosts = (cluster.a, cluster.b, cluster.c)
  key = "/kregd/default/reservations/rpl.*"
  assert kregctl(cluster.a, "reserve", "rpl.*", "--owner",
                 "65534").returncode == 0
  for h in hosts:
    wait_for(lambda: "rpl.*" in reserved(h), 30, "rpl.* reserved everywhere")
  assert kregctl(cluster.b, "reserve", "rpl.*", "--lift").returncode == 0
  for h in hosts:
    wait_for(lambda: "rpl.*" not in reserved(h), 30, "rpl.* lifted")
  lifting, lifted_at = etcd_raw(cluster, key)
  assert b'"lifted":true' in lifting, lifting
  assert kregctl(cluster.c, "reserve", "rpl.*", "--owner",
                 "65534").returncode == 0
  for h in hosts:
    wait_for(lambda: reserved(h).get("rpl.*", "").startswith("uid 65534"),
             30, "rpl.* reserved again")
  again, again_at = etcd_raw(cluster, key)

  before = [h.log(None).count("holds a replayed reserve record")
            for h in hosts]
  etcd_put(cluster, key, lifting)
  for h, n in zip(hosts, before):
    wait_for(lambda: h.log(None).count("holds a replayed reserve record") > n,
             30, "the replayed lifting logged")
    assert (f'etcd key "{key}" holds a replayed reserve record: it was '
            f"signed for version {lifted_at[1]} of the key as created at "
            f"revision {lifted_at[0]}") in h.log(None)
    assert "rpl.*" in reserved(h)
  wait_for(lambda: etcd_raw(cluster, key)[0].split(b"\n", 1)[1] ==
           again.split(b"\n", 1)[1] and
           etcd_raw(cluster, key)[1][1] > again_at[1] + 1, 30,
           "the reservation put back in etcd")
  d = start_host(cluster.root, "replayR", cluster.etcd.endpoints,
                 free_ports(1)[0])
  try:
    wait_synced(d)
    assert reserved(d).get("rpl.*", "").startswith("uid 65534")
  finally:
    d.stop()
  for h in hosts:
    assert "rpl.*" in reserved(h)
  assert kregctl(cluster.a, "reserve", "rpl.*", "--lift").returncode == 0


def test_etcd_member_loss_then_quorum_loss_then_recovery(cluster):
  known = variant(cluster.root, "known")
  assert register(cluster.a, "known.op", known).returncode == 0
  wait_for(lambda: ("known.op", "cpu") in listed(cluster.c), 30, "known.op")
  # One member down: the other two keep quorum; kregd fails over.
  cluster.etcd.kill(0)
  one = register(cluster.b, "q.one", variant(cluster.root, "q1"))
  assert one.returncode == 0, one.stderr
  assert one.stdout.startswith("registered")
  # Quorum lost: new registrations fail with UNAVAILABLE and say why ...
  cluster.etcd.kill(1)
  two = register(cluster.c, "q.two", variant(cluster.root, "q2"), timeout=120)
  assert two.returncode == 4, (two.stdout, two.stderr)
  assert "the cluster registry" in two.stderr and "unreachable" in two.stderr
  assert "this host did not register it" in two.stderr
  assert "cannot reach kregd" not in two.stderr
  assert ("q.two", "cpu") not in listed(cluster.c)
  cl = kregctl(cluster.c, "list", "--cluster")
  assert cl.returncode == 4 and "the cluster registry" in cl.stderr
  # ... while known targets keep working (launches never touch etcd, and an
  # identical re-registration is a local no-op).
  again = register(cluster.c, "known.op", known)
  assert again.returncode == 0 and "already registered" in again.stdout
  got = subprocess.run(
      [sys.executable, "-c", textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np, kreg, sys
        kreg.register_ffi_target("known.op", sys.argv[1], "Scale",
                                 platform="cpu")
        f = jax.jit(lambda x: jax.ffi.ffi_call(
            "known.op", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=2.0))
        print(np.asarray(f(jnp.arange(4, dtype=jnp.float32))).tolist())
      """), str(known)], env=cluster.c.env(), capture_output=True, text=True,
      timeout=300)
  assert got.returncode == 0, got.stderr
  assert got.stdout.strip().splitlines()[-1] == "[0.0, 2.0, 4.0, 6.0]"
  # In Python the same refusal is a KernelRegistrationError, not "kregd is
  # not running".
  py = subprocess.run(
      [sys.executable, "-c", textwrap.dedent("""
        import kreg, sys
        try:
          kreg.register_ffi_target("q.py", sys.argv[1], "Scale",
                                   platform="cpu")
        except kreg.KernelRegistrationError as e:
          print(type(e).__name__, e.code)
      """), str(variant(cluster.root, "qpy"))], env=cluster.c.env(),
      capture_output=True, text=True, timeout=300)
  assert py.stdout.strip() == "KernelRegistrationError UNAVAILABLE", py.stderr
  # etcd back: registration resumes.
  cluster.etcd.start(0)
  cluster.etcd.start(1)
  cluster.etcd.wait_healthy()
  # (A retry while etcd elects a leader may time out after etcd applied
  # it: the next one is then a no-op, "already registered".)
  q2 = variant(cluster.root, "q2")
  resumed = wait_for(
      lambda: (lambda r: r if r.returncode == 0 else None)(
          register(cluster.c, "q.two", q2)), 60, "registration to resume")
  assert "registered q.two (cpu) " + digest_of(q2) in resumed.stdout
  for h in (cluster.a, cluster.b, cluster.c):
    wait_for(lambda: listed(h).get(("q.two", "cpu"), {}).get(
        "module_digest") == digest_of(q2), 30, "q.two everywhere")


def test_peer_serving_wrong_bytes_is_refused(cluster):
  # Only host A holds the module: B and C are down while it registers.
  cluster.b.stop()
  cluster.c.stop()
  mod = variant(cluster.root, "corrupt")
  digest = digest_of(mod)
  try:
    assert register(cluster.a, "bad.fetch", mod, "--content-id",
                    "bad-build-1").returncode == 0
    # A's store copy rots (same size, other bytes); A serves it as is.
    f = store_file(cluster.a, digest)
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.chmod(0o600)
    f.write_bytes(bytes(data))
    cluster.b.start()
    wait_for(lambda: "served" in cluster.b.log(None) and digest in
             cluster.b.log(None), 30, "the fetch from A")
    log = cluster.b.log(None)
    assert f"for module {digest}; refused" in log
    assert ("bad.fetch", "cpu") not in listed(cluster.b)
    assert not store_file(cluster.b, digest).exists()
    # Registering it on B (same content_id claim, other bytes) needs the
    # binding's module: refused with DATA_LOSS naming the peer.
    out = register(cluster.b, "bad.fetch", variant(cluster.root, "corrupt2"),
                   "--content-id", "bad-build-1")
    assert out.returncode == 1, out.stderr
    assert "which this host does not hold and could not fetch" in out.stderr
    assert f"served {len(data)} bytes with digest" in out.stderr
    assert f"for module {digest}; refused" in out.stderr
    assert ("bad.fetch", "cpu") not in listed(cluster.b)
  finally:
    if not cluster.b.running():
      cluster.b.start()
    if not cluster.c.running():
      cluster.c.start()
    kregctl(cluster.a, "retire", "bad.fetch")


def test_binding_larger_than_max_module_bytes_is_not_fetched(cluster):
  # etcd's module_size is another host's claim: a host whose
  # max_module_bytes is smaller does not fetch the module at all.
  mod = variant(cluster.root, "toolarge")
  digest = digest_of(mod)
  size = mod.stat().st_size
  small = start_host(cluster.root, "hostD", cluster.etcd.endpoints,
                     free_ports(1)[0], "--max-module-bytes",
                     str(size // 2))
  try:
    assert register(cluster.a, "big.fetch", mod).returncode == 0
    wait_for(lambda: "big.fetch" in small.log(None) and
             "max_module_bytes" in small.log(None), 30,
             "host D to skip the binding")
    log = small.log(None)
    assert (f"module {digest} is bound in etcd with a size of {size} bytes, "
            f"more than this kregd's max_module_bytes ({size // 2}); "
            "not fetched") in log
    assert ("big.fetch", "cpu") not in listed(small)
    assert not store_file(small, digest).exists()
    wait_for(lambda: ("big.fetch", "cpu") in listed(cluster.b), 30,
             "host B (default max_module_bytes) to fetch it")
  finally:
    small.stop()
    kregctl(cluster.a, "retire", "big.fetch")


def test_restart_reconciles_the_journal_with_etcd(cluster):
  c = cluster.c
  c.stop()
  # Offline, C's journal gets bindings etcd does not have: run it standalone.
  alone = Daemon(c.root, c.allow_roots)
  alone.log_path = c.root / "standalone.log"
  alone.start()
  try:
    assert register(alone, "recon.op", variant(cluster.root, "reconX")
                    ).returncode == 0
    assert register(alone, "recon.local", variant(cluster.root, "reconL")
                    ).returncode == 0
  finally:
    alone.stop()
  y = variant(cluster.root, "reconY")
  assert register(cluster.a, "recon.op", y).returncode == 0
  c.start()
  wait_for(lambda: listed(c).get(("recon.op", "cpu"), {}).get(
      "module_digest") == digest_of(y), 30, "etcd's recon.op on C")
  log = c.log(None)
  assert "CLUSTER CONFLICT" in log and "recon.op" in log
  assert "the cluster's binding wins for new sessions" in log
  # Not in etcd: kept (only a signed retirement retires), and said so.
  assert ("recon.local", "cpu") in listed(c)
  assert ('target "recon.local" (cpu) (content ' in log and
          "is bound here but etcd holds no signed binding or retirement of "
          "it" in log), log
  assert kregctl(c, "retire", "recon.local").returncode == 0


# ---- TLS between hosts.

def openssl(*args, cwd):
  subprocess.run(["openssl", *args], cwd=cwd, check=True,
                 capture_output=True)


def make_ca(d: pathlib.Path, name: str) -> None:
  d.mkdir(parents=True, exist_ok=True)
  openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
          "-subj", f"/CN={name}", "-keyout", "ca.key", "-out", "ca.pem",
          cwd=d)


def make_cert(d: pathlib.Path, name: str) -> tuple[str, str]:
  (d / "ext.cnf").write_text(
      "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
      "extendedKeyUsage=serverAuth,clientAuth\n")
  openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
          "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
  openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey",
          "ca.key", "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf",
          "-out", f"{name}.pem", cwd=d)
  return str(d / f"{name}.pem"), str(d / f"{name}.key")


def fetch_raw(address: str, digest: str, creds=None):
  """kreg.v1.ModuleExchange/FetchModule with grpcio, as any client could."""
  import grpc  # pylint: disable=import-outside-toplevel
  req = b"\x0a" + bytes([len(digest)]) + digest.encode()
  ch = (grpc.secure_channel(address, creds) if creds else
        grpc.insecure_channel(address))
  call = ch.unary_stream("/kreg.v1.ModuleExchange/FetchModule",
                         request_serializer=lambda b: b,
                         response_deserializer=lambda b: b)
  try:
    return b"".join(list(call(req, timeout=10)))
  finally:
    ch.close()


def test_tls_required_between_hosts_when_configured(cluster):
  if shutil.which("openssl") is None:
    pytest.fail("openssl missing: tools/setup.sh installs it")
  import grpc  # pylint: disable=import-outside-toplevel
  pki = cluster.root / "pki"
  make_ca(pki, "kreg-test-ca")
  cert1, key1 = make_cert(pki, "t1")
  cert2, key2 = make_cert(pki, "t2")
  rogue = cluster.root / "rogue"
  make_ca(rogue, "rogue-ca")
  rcert, rkey = make_cert(rogue, "r")
  ca = str(pki / "ca.pem")
  p1, p2, p3 = free_ports(3)
  tls = lambda c, k: ["--cluster", "tls", "--peer-tls-ca", ca,
                      "--peer-tls-cert", c, "--peer-tls-key", k]
  t1 = start_host(cluster.root, "t1", cluster.etcd.endpoints, p1,
                  *tls(cert1, key1))
  t2 = start_host(cluster.root, "t2", cluster.etcd.endpoints, p2,
                  *tls(cert2, key2))
  plain = start_host(cluster.root, "t3", cluster.etcd.endpoints, p3,
                     "--cluster", "tls")
  try:
    mod = variant(cluster.root, "tls")
    digest = digest_of(mod)
    assert register(t1, "tls.op", mod).returncode == 0
    # A TLS peer fetches over mutual TLS.
    wait_for(lambda: ("tls.op", "cpu") in listed(t2), 30, "tls.op on t2")
    assert store_file(t2, digest).read_bytes() == mod.read_bytes()
    # A plaintext kregd cannot fetch from a TLS host.
    wait_for(lambda: "could not fetch its module" in plain.log(None), 30,
             "the plaintext host to give up")
    assert ("tls.op", "cpu") not in listed(plain)
    # Neither can a plaintext client, nor a TLS client without a cert or
    # with one from another CA.
    ca_pem = (pki / "ca.pem").read_bytes()
    for creds in (None, grpc.ssl_channel_credentials(ca_pem),
                  grpc.ssl_channel_credentials(
                      ca_pem, pathlib.Path(rkey).read_bytes(),
                      pathlib.Path(rcert).read_bytes())):
      with pytest.raises(grpc.RpcError) as e:
        fetch_raw(f"127.0.0.1:{p1}", digest, creds)
      assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    # With the CA's certificate it is served (bytes as stored).
    ok = fetch_raw(f"127.0.0.1:{p1}", digest, grpc.ssl_channel_credentials(
        ca_pem, pathlib.Path(key2).read_bytes(),
        pathlib.Path(cert2).read_bytes()))
    assert mod.read_bytes()[:4096] in ok and len(ok) > mod.stat().st_size
  finally:
    for d in (t1, t2, plain):
      d.stop()


def test_module_exchange_rejects_bad_requests(cluster):
  import grpc  # pylint: disable=import-outside-toplevel
  addr = f"127.0.0.1:{cluster.ports['hostA']}"
  for bad in ("", "sha256:zz", "md5:" + "0" * 32, "sha256:" + "A" * 64):
    with pytest.raises(grpc.RpcError) as e:
      fetch_raw(addr, bad)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not \"sha256:\" followed by 64 lowercase hex" in \
        e.value.details()
  with pytest.raises(grpc.RpcError) as e:
    fetch_raw(addr, "sha256:" + "0" * 64)
  assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_peer_serves_at_most_four_fetches_at_once(cluster):
  # docs/operator-guide.md "Sizing": a fifth fetch while four are being
  # served is told to ask another peer, before any file is opened; one
  # ends, the next is served.
  import grpc  # pylint: disable=import-outside-toplevel
  big = cluster.root / "demo-busy.so"
  big.write_bytes(variant(cluster.root, "busy").read_bytes() +
                  b"\0" * (8 << 20))
  assert register(cluster.a, "busy.op", big).returncode == 0
  # The other hosts mirror the binding by fetching from hostA: those fetches
  # hold slots too, so they finish before this test counts its own.
  for h in (cluster.b, cluster.c):
    wait_for(lambda: ("busy.op", "cpu") in listed(h), 60, "busy.op mirrored")
  digest = digest_of(big)
  req = b"\x0a" + bytes([len(digest)]) + digest.encode()
  # No BDP probing: the window stays at 64 KiB, so a stream this test does
  # not read keeps kregd's handler waiting to send.
  ch = grpc.insecure_channel(f"127.0.0.1:{cluster.ports['hostA']}",
                             options=[("grpc.http2.bdp_probe", 0)])
  fetch = ch.unary_stream("/kreg.v1.ModuleExchange/FetchModule",
                          request_serializer=lambda b: b,
                          response_deserializer=lambda b: b)
  held = []
  try:
    held += [fetch(req, timeout=60) for _ in range(4)]
    for call in held:  # each has started: its first chunk arrived
      assert len(next(call)) > 0
    with pytest.raises(grpc.RpcError) as e:
      list(fetch(req, timeout=30))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert e.value.details() == ("busy: serving 4 fetches (at most 4 at "
                                 "once); ask another peer")
    held[0].cancel()

    def served():
      try:
        return b"".join(fetch(req, timeout=30))
      except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNAVAILABLE and "busy" in e.details():
          return None
        raise
    got = wait_for(served, 30, "a slot to free up")
    # The chunks as sent (protobuf-framed): the whole module in them.
    assert len(got) > big.stat().st_size
    assert big.read_bytes()[:4096] in got
  finally:
    for call in held[1:]:
      call.cancel()
    ch.close()
  assert kregctl(cluster.a, "retire", "busy.op").returncode == 0


@pytest.mark.parametrize("flags, message", [
    (["--etcd-endpoints", "http://127.0.0.1:1", "--advertise", "127.0.0.1:9",
      "--cluster-key-file", "/k"],
     "etcd endpoint \"http://127.0.0.1:1\" is plaintext: anyone who can "
     "reach it can read and rewrite the cluster's bindings. Use https:// "
     "(etcd with client certificate auth; kregd presents peer_tls_cert), or "
     "set cluster_insecure = true (--cluster-insecure)"),
    (["--etcd-endpoints", "127.0.0.1:1", "--advertise", "127.0.0.1:9",
      "--cluster-key-file", "/k"],
     "etcd endpoint \"127.0.0.1:1\" is plaintext"),
    (["--etcd-endpoints", "https://127.0.0.1:1", "--advertise",
      "127.0.0.1:9"], "cluster mode (--etcd-endpoints) needs cluster_key_file "
     "(--cluster-key-file)"),
    (["--etcd-endpoints", "http://127.0.0.1:1", "--cluster-insecure"],
     "needs --advertise HOST:PORT"),
    (["--etcd-endpoints", "ftp://x:1", "--advertise", "127.0.0.1:9"],
     "etcd endpoint \"ftp://x:1\" has an unknown scheme"),
    (["--etcd-endpoints", "http://x", "--advertise", "127.0.0.1:9"],
     "etcd endpoint \"http://x\" is not HOST:PORT"),
    (["--etcd-endpoints", "http://x:1", "--cluster-insecure",
      "--advertise", "nowhere"],
     "advertise address \"nowhere\" is not HOST:PORT"),
    (["--etcd-endpoints", "http://127.0.0.1:1", "--cluster-insecure",
      "--advertise", "unix:1"],
     "advertise address \"unix:1\" is not a host name, IPv4 or [IPv6] "
     "address with a port that other hosts can dial"),
    (["--etcd-endpoints", "http://x:1", "--advertise", "127.0.0.1:9",
      "--cluster-insecure", "--cluster", "a/b"],
     "cluster name \"a/b\" must be 1-64 characters"),
    (["--etcd-endpoints", "http://x:1", "--advertise", "127.0.0.1:9",
      "--cluster-insecure", "--peer-tls-ca", "/x"],
     "needs all three of peer_tls_ca"),
])
def test_bad_cluster_flags_are_refused(tmp_path, flags, message):
  from kregd_proc import daemon_binary  # pylint: disable=import-outside-toplevel
  out = subprocess.run([str(daemon_binary()), "--socket",
                        str(tmp_path / "s"), "--state-dir",
                        str(tmp_path / "st"), *flags], capture_output=True,
                       text=True, timeout=30)
  assert out.returncode == 2, out.stderr
  assert message in out.stderr


def test_unreadable_tls_files_stop_kregd(tmp_path):
  from kregd_proc import daemon_binary  # pylint: disable=import-outside-toplevel
  out = subprocess.run([str(daemon_binary()), "--socket",
                        str(tmp_path / "s"), "--state-dir",
                        str(tmp_path / "st"), "--etcd-endpoints",
                        "http://127.0.0.1:1", "--advertise", "127.0.0.1:9",
                        "--cluster-insecure", "--cluster-key-file",
                        str(cluster_key(tmp_path)),
                        "--peer-tls-ca", str(tmp_path / "none.pem"),
                        "--peer-tls-cert", "/dev/null", "--peer-tls-key",
                        "/dev/null"], capture_output=True, text=True,
                       timeout=30)
  assert out.returncode == 1
  assert f"cannot read the peer TLS CA certificate \"{tmp_path}/none.pem\"" \
      in out.stderr


def test_cluster_key_file_must_be_private(tmp_path):
  from kregd_proc import daemon_binary  # pylint: disable=import-outside-toplevel
  key = tmp_path / "k"
  run = lambda: subprocess.run(
      [str(daemon_binary()), "--socket", str(tmp_path / "s"), "--state-dir",
       str(tmp_path / "st"), "--etcd-endpoints", "http://127.0.0.1:1",
       "--cluster-insecure", "--advertise", "127.0.0.1:9",
       "--cluster-key-file", str(key)], capture_output=True, text=True,
      timeout=30)
  out = run()
  assert out.returncode == 1, out.stderr
  assert f"cannot read the cluster key file \"{key}\" (cluster_key_file)" \
      in out.stderr
  key.write_text("f" * 64 + "\n")
  key.chmod(0o644)
  out = run()
  assert out.returncode == 1, out.stderr
  assert (f"the cluster key file \"{key}\" (cluster_key_file) has mode 0644: "
          "group or others can read or write it") in out.stderr
  assert "chmod 600" in out.stderr


def test_standalone_kregd_says_it_is_not_clustered(kregd):
  # A usage/precondition failure (exit 2), not "registration refused" (3).
  for args, what in ((["list", "--cluster"], "cluster-wide bindings"),
                     (["hosts"], "cluster hosts"),
                     (["hosts", "--json"], "cluster hosts")):
    out = kregctl(kregd, *args)
    assert out.returncode == 2, (args, out.returncode, out.stderr)
    assert out.stdout == ""
    assert ("this kregd is not in cluster mode (cluster mode is off: no etcd "
            f"endpoints are configured), so it has no {what} to list. Turn "
            "cluster mode on by starting kregd with --etcd-endpoints "
            "URL[,URL...] --advertise HOST:PORT") in out.stderr, out.stderr
