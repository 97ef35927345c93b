"""The compile service (docs/design.md §13, docs/user-guide.md "Compile
once"): kregd compiles a kernel once, in a sandboxed worker running as the
caller, and registers it with content_id = the cache key. Every test starts
the real kregd; the kernels run in real JAX."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kreg
import kregd_proc
import kernels_util as ku

pytest.importorskip("grpc")

AXPB = r"""
#include <cstdint>
#include "xla/ffi/api/ffi.h"
#include "axpb.h"

namespace ffi = xla::ffi;

// y = a * x + b, elementwise (b from axpb.h unless -DKREG_B=... is given).
static ffi::Error Axpb(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y,
                       float a) {
  for (size_t i = 0; i < x.element_count(); ++i) {
    y->typed_data()[i] = a * x.typed_data()[i] + KREG_B;
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AxpbHandler, Axpb,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("a"));
"""
AXPB_H = "#ifndef KREG_B\n#define KREG_B 0.5f\n#endif\n"

LIMITS_TOML = """
compile_cpu_s = 5
compile_timeout_s = 120.0
compile_memory_bytes = 536870912
compile_output_bytes = 4194304
"""

# Burns CPU in the compiler with little memory (constexpr evaluation).
SPIN = r"""
constexpr long Spin(long n) { long s = 0; for (long i = 0; i < n; ++i) s += i % 7; return s; }
static_assert(Spin(1L << 40) > 0, "spin");
"""
SPIN_OPTIONS = ("-fconstexpr-ops-limit=4294967296",
                "-fconstexpr-loop-limit=2147483647")


def unique(text: str) -> str:
  """`text` with a comment that makes its cache key new."""
  return f"// {uuid.uuid4()}\n{text}"


def call(name: str, x: np.ndarray, a: float) -> np.ndarray:
  f = jax.jit(lambda v: jax.ffi.ffi_call(
      name, jax.ShapeDtypeStruct(v.shape, v.dtype))(v, a=np.float32(a)))
  return np.asarray(f(jnp.asarray(x)))


@pytest.fixture(scope="module")
def daemon():
  d = kregd_proc.start_test_daemon("kreg-compile-")
  kreg.connect(d.socket)
  yield d
  kregd_proc.finish_test_daemon(d)


@pytest.fixture(scope="module")
def limited():
  """A kregd with small compile limits (LIMITS_TOML)."""
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-climits-", dir="/tmp"))
  (root / "limits.toml").write_text(LIMITS_TOML)
  d = kregd_proc.start_test_daemon(
      "kreg-compile-lim-", ["--config", str(root / "limits.toml")])
  yield d
  kregd_proc.finish_test_daemon(d)
  shutil.rmtree(root, ignore_errors=True)


def compiles(d) -> int:
  return d.status()["compiles"]


def test_compile_and_call_equals_the_same_source_built_in_process(
    daemon, tmp_path):
  reg = kreg.compile_ffi_target("cc.axpb", {"axpb.cc": AXPB}, "AxpbHandler",
                                platform="cpu", headers={"axpb.h": AXPB_H})
  assert reg.created and not reg.cache_hit
  assert reg.content_id == reg.cache_key
  assert reg.content_id.startswith("kcc-sha256:") and len(
      reg.content_id) == len("kcc-sha256:") + 64
  # Every field of kregd's answer, as `kregctl show` prints it.
  shown = json.loads(kregd_proc.run_kregctl(daemon, "show", "cc.axpb",
                                            "--json").stdout)[0]
  t = dataclasses.asdict(reg.target)
  assert f"{t.pop('ffi_api_major')}.{t.pop('ffi_api_minor')}" == shown[
      "ffi_api"]
  assert time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(
      t.pop("registered_at_us") // 10**6)) == shown["registered_at"]
  assert t == {k: shown[k] for k in t}
  assert t["func_name"] == "AxpbHandler" and t["pid"] == os.getpid()
  assert t["origin"].startswith("compile:axpb.cc, ") and t["host"] == ""
  # The same source built here with the same compiler and headers.
  (tmp_path / "axpb.cc").write_text(AXPB)
  (tmp_path / "axpb.h").write_text(AXPB_H)
  so = tmp_path / "libaxpb.so"
  subprocess.run(["g++", "-shared", "-fPIC", "-O2", "-std=c++17", "-I.",
                  "-isystem", jax.ffi.include_dir(), "axpb.cc", "-o",
                  str(so)], cwd=tmp_path, check=True, capture_output=True)
  lib = ctypes.cdll.LoadLibrary(str(so))
  jax.ffi.register_ffi_target("cc.axpb.inproc",
                              jax.ffi.pycapsule(lib.AxpbHandler),
                              platform="cpu")
  x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
  got = call("cc.axpb", x, 3.0)
  want = call("cc.axpb.inproc", x, 3.0)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(got, 3.0 * x + 0.5, rtol=1e-6)


def test_the_same_source_again_is_a_cache_hit_and_a_no_op(daemon):
  src = unique(AXPB)
  first = kreg.compile_ffi_target("cc.again", {"k.cc": src}, "AxpbHandler",
                                  platform="cpu", headers={"axpb.h": AXPB_H})
  before = compiles(daemon)
  again = kreg.compile_ffi_target("cc.again", {"k.cc": src}, "AxpbHandler",
                                  platform="cpu", headers={"axpb.h": AXPB_H})
  assert again.cache_hit and not again.created and not again
  assert again.content_id == first.content_id
  assert again.target.module_digest == first.target.module_digest
  assert compiles(daemon) == before
  # Another name with the same sources: no compile either.
  other = kreg.compile_ffi_target("cc.again.other", {"k.cc": src},
                                  "AxpbHandler", platform="cpu",
                                  headers={"axpb.h": AXPB_H})
  assert other.created and other.cache_hit
  assert compiles(daemon) == before
  st = daemon.status()
  assert st["compile_cache_entries"] >= 1 and st["compile_cache_hits"] >= 2


def test_what_the_cache_key_covers(daemon):
  src = unique(AXPB)
  keys = set()
  for sources, headers, options in (
      ({"k.cc": src}, {"axpb.h": AXPB_H}, ()),
      ({"k.cc": src}, {"axpb.h": AXPB_H + "\n"}, ()),
      ({"k.cc": src}, {"axpb.h": AXPB_H}, ("-DKREG_B=1.5f",)),
      ({"k2.cc": src}, {"axpb.h": AXPB_H}, ())):
    reg = kreg.compile_ffi_target(f"cc.key{len(keys)}", sources,
                                  "AxpbHandler", platform="cpu",
                                  headers=headers, options=options)
    keys.add(reg.content_id)
  assert len(keys) == 4
  x = np.arange(4, dtype=np.float32)
  np.testing.assert_allclose(call("cc.key2", x, 1.0), x + 1.5)


def test_a_changed_source_under_the_same_name_is_refused(daemon):
  src = unique(AXPB)
  first = kreg.compile_ffi_target("cc.changed", {"k.cc": src}, "AxpbHandler",
                                  platform="cpu", headers={"axpb.h": AXPB_H})
  with pytest.raises(kreg.KernelRegistrationError) as info:
    kreg.compile_ffi_target("cc.changed", {"k.cc": src + "\n// edited\n"},
                            "AxpbHandler", platform="cpu",
                            headers={"axpb.h": AXPB_H})
  e = info.value
  assert e.code == "FAILED_PRECONDITION"
  assert 'target "cc.changed" is already registered' in e.message
  assert first.content_id in e.message
  assert 'new target name (name="cc.changed.v2"' in e.message


def test_a_syntax_error_returns_the_diagnostic_with_the_callers_file_names(
    daemon):
  bad = "#include \"axpb.h\"\nint f() {\n  return 1 +;\n}\n"
  with pytest.raises(kreg.CompileError) as info:
    kreg.compile_ffi_target("cc.syntax", {"my_kernel.cc": bad}, "f",
                            platform="cpu", headers={"axpb.h": AXPB_H})
  e = info.value
  assert e.code == "INVALID_ARGUMENT"
  assert "my_kernel.cc:3:" in e.diagnostics and "error:" in e.diagnostics
  assert e.diagnostics in e.message
  assert 'compile of target "cc.syntax" (cpu) failed' in e.message
  # No scratch path of kregd's leaks into what the caller reads.
  assert "/tmp/src" not in e.diagnostics and "kregd-compile" not in e.diagnostics
  # Nothing was registered.
  assert "cc.syntax" not in [t.target_name
                             for t in kreg.list_registered_targets()]


def test_a_missing_symbol_is_refused_by_registration(daemon):
  with pytest.raises(kreg.InvalidArgumentError) as info:
    kreg.compile_ffi_target("cc.nosym", {"k.cc": unique(AXPB)}, "NoSuchSym",
                            platform="cpu", headers={"axpb.h": AXPB_H})
  assert "NoSuchSym" in info.value.message


@pytest.mark.parametrize("sources,headers,options,want", [
    ({"../x.cc": "int x;"}, None, (), 'source name "../x.cc" must be a plain'),
    ({"a/x.cc": "int x;"}, None, (), 'source name "a/x.cc" must be a plain'),
    ({"/abs.cc": "int x;"}, None, (), 'source name "/abs.cc" must be a plain'),
    ({"-x.cc": "int x;"}, None, (), "not starting with '-'"),
    ({"x.txt": "int x;"}, None, (), "needs a C or C++ source extension"),
    ({"x.cu": "int x;"}, None, (), "needs a C or C++ source extension"),
    ({}, None, (), "no sources"),
    ({"x.cc": "int x;"}, {"../h.h": ""}, (), 'header name "../h.h" has an'),
    ({"x.cc": "int x;"}, {"/etc/h.h": ""}, (), "must be a relative path"),
    ({"x.cc": "int x;"}, {"a//h.h": ""}, (), "has an empty"),
    ({"x.cc": "int x;"}, {"x.cc": ""}, (), "is sent twice"),
    ({f"x{i}.cc": "" for i in range(257)}, None, (), "257 files"),
    ({"x.cc": "x" * (7 << 20)}, None, (), "exceed the limit of 7340032 bytes"),
    ({"x.cc": "int x;"}, None, ("-DA=\0",), "without NUL"),
    ({"x.cc": "int x;"}, None, tuple(["-O2"] * 65), "65 options"),
])
def test_hostile_requests_are_refused_before_anything_runs(
    daemon, sources, headers, options, want):
  before = compiles(daemon)
  with pytest.raises(kreg.KregError) as info:
    kreg.compile_ffi_target("cc.hostile", sources, "f", platform="cpu",
                            headers=headers, options=options)
  assert info.value.code == "INVALID_ARGUMENT", info.value.message
  assert want in info.value.message, info.value.message
  assert compiles(daemon) == before


@pytest.mark.parametrize("name,func,platform,want", [
    ("9bad", "f", "cpu", "9bad"),
    ("cc.ok", "no-such", "cpu", "no-such"),
    ("cc.ok", "f", "rocm", "rocm"),
])
def test_bad_names_and_platforms_are_refused(daemon, name, func, platform,
                                             want):
  with pytest.raises(kreg.KregError) as info:
    kreg.compile_ffi_target(name, {"x.cc": "int x;"}, func, platform=platform)
  assert want in info.value.message


def test_python_side_type_errors(daemon):
  with pytest.raises(TypeError, match="sources must map file names"):
    kreg.compile_ffi_target("cc.t", ["x.cc"], "f")
  with pytest.raises(TypeError, match="not one string"):
    kreg.compile_ffi_target("cc.t", {"x.cc": ""}, "f", options="-O2")
  with pytest.raises(ValueError, match="is not a directory"):
    kreg.compile_ffi_target("cc.t", {"x.cc": ""}, "f",
                            headers=["/nonexistent/include"])


@pytest.mark.parametrize("hidden,want", [
    ("grpc", "kreg.compile_ffi_target talks to kregd's gRPC API and needs "
     "grpcio and protobuf (import of grpc halted; None in sys.modules): pip "
     "install 'kreg[compile]'"),
    ("google.protobuf", "needs grpcio and protobuf (import of google.protobuf "
     "halted; None in sys.modules): pip install 'kreg[compile]'"),
    ("kreg.v1", "cannot import kreg.v1.registry_pb2, kreg's generated "
     "protobuf module (import of kreg.v1 halted; None in sys.modules): it "
     "needs protobuf>=4.21 (pip install 'kreg[compile]'); in a source "
     "checkout, run `bazel build //client/python:kreg_pb2` and put "
     "bazel-bin/client/python on PYTHONPATH"),
])
def test_missing_libraries_are_named(daemon, monkeypatch, hidden, want):
  monkeypatch.setitem(sys.modules, hidden, None)
  with pytest.raises(ImportError) as e:
    kreg.compile_ffi_target("cc.t", {"x.cc": ""}, "f")
  assert want in str(e.value)


def test_a_stream_without_a_result_is_an_error(tmp_path):
  # Not kregd: a server whose CompileTarget stream ends OK without a result.
  import grpc  # pylint: disable=import-outside-toplevel
  from concurrent import futures  # pylint: disable=import-outside-toplevel
  from kreg import _compile  # pylint: disable=import-outside-toplevel
  server = grpc.server(futures.ThreadPoolExecutor(1))
  empty = grpc.unary_stream_rpc_method_handler(lambda request, ctx: iter(()))
  server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
      "kreg.v1.Registry", {"CompileTarget": empty})])
  sock = tmp_path / "fake.sock"
  server.add_insecure_port(f"unix:{sock}")
  server.start()
  try:
    request = _compile.encode_request("cc.t", {"x.cc": ""}, "f", "cpu", (),
                                      None, None, False)
    with pytest.raises(kreg.KregError) as e:
      _compile.compile_target(str(sock), request, 60)
  finally:
    server.stop(None)
  assert str(e.value) == "kregd ended the compile without a result"
  assert e.value.code == "INTERNAL"


def test_an_include_directory_is_sent_as_its_files(daemon, tmp_path):
  inc = tmp_path / "inc"
  (inc / "detail").mkdir(parents=True)
  (inc / "detail" / "b.h").write_text("#define KREG_B 2.0f\n")
  src = unique(AXPB).replace('#include "axpb.h"', '#include <detail/b.h>')
  kreg.compile_ffi_target("cc.incdir", {"k.cc": src}, "AxpbHandler",
                          platform="cpu", headers=[str(inc)])
  x = np.arange(3, dtype=np.float32)
  np.testing.assert_allclose(call("cc.incdir", x, 2.0), 2.0 * x + 2.0)


CHILD = r"""
import json, os, pathlib, sys, time
import kreg
go = pathlib.Path(sys.argv[1])
src = pathlib.Path(sys.argv[2]).read_text()
(go.parent / f"ready.{os.getpid()}").touch()
while not go.exists():
  time.sleep(0.005)
r = kreg.compile_ffi_target("cc.eight", {"eight.cc": src}, "AxpbHandler",
                            platform="cpu", headers={"axpb.h": sys.argv[3]})
print(json.dumps({"content_id": r.content_id, "created": r.created,
                  "cache_hit": r.cache_hit, "waited": r.waited}))
"""


def test_eight_processes_compile_one_source_once(tmp_path):
  d = kregd_proc.start_test_daemon("kreg-compile8-")
  try:
    src = tmp_path / "eight.cc"
    src.write_text(unique(AXPB))
    go = tmp_path / "go"
    procs = [subprocess.Popen(
        [sys.executable, "-c", CHILD, str(go), str(src), AXPB_H],
        env=d.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for _ in range(8)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready.*"))) < 8:
      assert time.monotonic() < deadline, "children did not start"
      assert all(p.poll() is None for p in procs), [
          p.communicate() for p in procs]
      time.sleep(0.05)
    go.touch()
    results = []
    for p in procs:
      out, err = p.communicate(timeout=180)
      assert p.returncode == 0, err + d.log()
      results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r["content_id"] for r in results}) == 1
    assert sum(r["created"] for r in results) == 1
    st = d.status()
    assert st["compiles"] == 1, st
    assert st["compile_requests"] == 8
    assert st["compile_waits"] + st["compile_cache_hits"] == 7
    # Each process can tell whether it compiled, waited or hit the cache.
    assert sum(r["waited"] for r in results) == st["compile_waits"], results
    assert sum(r["cache_hit"] for r in results) == st["compile_cache_hits"]
    assert sum(not (r["waited"] or r["cache_hit"]) for r in results) == 1
  finally:
    kregd_proc.finish_test_daemon(d)


def limit_error(d, name, text, options=()):
  client = kreg.Client(d.socket)  # the default stays the module's kregd
  with pytest.raises(kreg.CompileError) as info:
    client.compile_ffi_target(name, {"k.cc": text}, "f", platform="cpu",
                              options=options)
  assert info.value.code == "RESOURCE_EXHAUSTED", info.value.message
  return info.value.message


def still_serves(d):
  client = kreg.Client(d.socket)  # the default stays the module's kregd
  reg = client.compile_ffi_target(f"cc.after.{uuid.uuid4().hex[:8]}",
                                  {"k.cc": unique(AXPB)}, "AxpbHandler",
                                  platform="cpu", headers={"axpb.h": AXPB_H})
  assert reg.created
  assert d.running()


def test_including_dev_zero_stops_at_the_memory_limit_and_kregd_serves_on(
    limited):
  msg = limit_error(limited, "cc.zero", '#include "/dev/zero"\n')
  assert ("it hit the memory limit of 536870912 bytes (compile_memory_bytes)"
          in msg), msg
  assert "raise compile_memory_bytes in kregd's config" in msg
  still_serves(limited)


def test_the_cpu_time_limit(limited):
  msg = limit_error(limited, "cc.cpu", SPIN, SPIN_OPTIONS)
  assert "it hit the CPU time limit of 5 s (compile_cpu_s)" in msg, msg
  still_serves(limited)


def test_the_output_size_limit(limited):
  msg = limit_error(limited, "cc.big", "char big[8 << 20] = {1};\n")
  assert ("it hit the output size limit of 4194304 bytes "
          "(compile_output_bytes)") in msg, msg


def test_the_wall_clock_limit(tmp_path):
  # Its own kregd: a short wall clock would stop the other limits' compiles
  # on a busy machine before their own limit.
  cfg = tmp_path / "c.toml"
  cfg.write_text("compile_timeout_s = 3.0\n")
  d = kregd_proc.start_test_daemon("kreg-compile-wall-",
                                   ["--config", str(cfg)])
  fifo_dir = pathlib.Path(tempfile.mkdtemp(prefix="kreg-fifo-",
                                           dir="/var/tmp"))
  try:
    fifo = fifo_dir / "never_written"
    os.mkfifo(fifo)
    os.chmod(fifo_dir, 0o755)
    os.chmod(fifo, 0o666)
    start = time.monotonic()
    msg = limit_error(d, "cc.wall", f'#include "{fifo}"\n')
    assert "it hit the wall-clock limit of 3 s (compile_timeout_s)" in msg
    assert time.monotonic() - start < 30
    assert d.running()
  finally:
    shutil.rmtree(fifo_dir, ignore_errors=True)
    kregd_proc.finish_test_daemon(d)


def test_bad_compile_config_values_are_refused(tmp_path):
  for line, want in (
      ("compile_cpu_s = 0", "a whole number from 1 to 100000"),
      ("compile_timeout_s = -1.0", "a number of seconds > 0"),
      ("compile_memory_bytes = 100", "at least 1048576"),
      ("compile_cxx = \"g++\"", "an absolute path"),
      ("max_parallel_compiles = \"two\"", "a whole number from 0")):
    cfg = tmp_path / "c.toml"
    cfg.write_text(line + "\n")
    p = subprocess.run([str(kregd_proc.daemon_binary()), "--config", str(cfg),
                        "--socket", str(tmp_path / "s"), "--state-dir",
                        str(tmp_path / "st")], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 2, p.stderr
    assert want in p.stderr and line.split(" ")[0] in p.stderr, p.stderr


def test_cuda_without_nvcc_names_nvcc(tmp_path):
  cfg = tmp_path / "c.toml"
  cfg.write_text('compile_nvcc = "/nonexistent/bin/nvcc"\n')
  d = kregd_proc.start_test_daemon("kreg-compile-nonvcc-",
                                   ["--config", str(cfg)])
  try:
    client = kreg.Client(d.socket)  # the default stays the module's kregd
    with pytest.raises(kreg.KregError) as info:
      client.compile_ffi_target("cc.cu", {"k.cu": "int x;"}, "f",
                                platform="CUDA")
    e = info.value
    assert e.code == "FAILED_PRECONDITION"
    assert ("compiling for cuda needs nvcc, which kregd did not find at "
            "/nonexistent/bin/nvcc") in e.message
    assert "compile_nvcc" in e.message
  finally:
    kregd_proc.finish_test_daemon(d)


# -- as another uid (root only: the tests run as root in CI) --------------

def as_nobody(d, tmp_root: pathlib.Path, *args: str):
  """`kregctl compile ARGS...` as uid 65534 (group 0: the socket's)."""
  kregctl = kregd_proc.kregctl_binary()
  if kregctl is None:
    pytest.skip("kregctl not built")
  exe = tmp_root / "kregctl"
  if not exe.exists():
    shutil.copy(kregctl, exe)
    os.chmod(exe, 0o755)
  os.chmod(d.root, 0o711)
  # setpriv changes the uid after exec: a child forked from this process
  # (whose threads may be inside grpcio calls, e.g. start_compile's) only
  # execs. Python's own user= would run setuid in that child, which crashed
  # it now and then (SIGSEGV before exec) while gRPC calls were in flight.
  return subprocess.run(["setpriv", "--reuid=65534", "--regid=0",
                         "--clear-groups", "--", str(exe), "--socket",
                         d.socket, "compile", *args],
                        capture_output=True, text=True, timeout=120, cwd="/")


@pytest.fixture
def nobody_dir():
  if os.geteuid() != 0:
    pytest.skip("needs root: the client runs as uid 65534")
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-nobody-", dir="/var/tmp"))
  os.chmod(root, 0o755)
  yield root
  shutil.rmtree(root, ignore_errors=True)


def test_one_uids_build_is_never_handed_to_another_uid(daemon, nobody_dir):
  # A compile runs as its caller, who could tamper with it: a build is reused
  # only for the same uid. Another uid compiling the same sources compiles
  # again (no cache hit) and gets the same key, so the content_id rules
  # are unchanged.
  src = nobody_dir / "shared.cc"
  src.write_text(unique(AXPB).replace('#include "axpb.h"',
                                      "#define KREG_B 3.0f"))
  os.chmod(src, 0o644)
  root = kreg.compile_ffi_target("cc.uid.root", {"shared.cc": src.read_text()},
                                 "AxpbHandler", platform="cpu")
  assert not root.cache_hit
  again = kreg.compile_ffi_target("cc.uid.root2",
                                  {"shared.cc": src.read_text()},
                                  "AxpbHandler", platform="cpu")
  assert again.cache_hit  # the same uid reuses its build
  p = as_nobody(daemon, nobody_dir, "cc.uid.nobody", "AxpbHandler", str(src),
                "--json")
  assert p.returncode == 0, p.stdout + p.stderr
  out = json.loads(p.stdout)
  assert not out["cache_hit"] and not out["waited"], out
  assert out["cache_key"] == root.content_id


def test_a_header_the_caller_cannot_read_cannot_be_included_through_kregd(
    daemon, nobody_dir):
  secret_dir = nobody_dir / "secret"
  secret_dir.mkdir()
  secret = secret_dir / "secret.h"
  secret.write_text("#define KREG_B 42.0f\n")
  os.chmod(secret, 0o600)  # root's only
  os.chmod(secret_dir, 0o755)
  src = nobody_dir / "steal.cc"
  src.write_text(unique(AXPB).replace('#include "axpb.h"',
                                      f'#include "{secret}"'))
  os.chmod(src, 0o644)
  p = as_nobody(daemon, nobody_dir, "cc.steal", "AxpbHandler", str(src))
  assert p.returncode == 2, p.stdout + p.stderr
  assert f"{secret}: Permission denied" in p.stderr, p.stderr
  assert "steal.cc:" in p.stderr
  # Through an include directory, kregctl reads as its caller: refused.
  p = as_nobody(daemon, nobody_dir, "cc.steal2", "AxpbHandler", str(src),
                "--include-dir", str(secret_dir))
  assert p.returncode == 1, p.stdout + p.stderr
  assert "cannot read" in p.stderr and "secret.h" in p.stderr, p.stderr
  # The same source compiles for root: the file is there, only unreadable.
  reg = kreg.compile_ffi_target("cc.steal.root",
                                {"steal.cc": src.read_text()}, "AxpbHandler",
                                platform="cpu")
  assert reg.created


def test_the_compiler_cannot_write_outside_its_scratch_directory(
    daemon, nobody_dir):
  # Even for root: every mount is read-only in the compile's namespace.
  deps = nobody_dir / "deps.d"
  with pytest.raises(kreg.CompileError) as info:
    kreg.compile_ffi_target("cc.write", {"k.cc": unique("int x;\n")}, "f",
                            platform="cpu", options=("-MD", "-MF", str(deps)))
  assert "Read-only file system" in info.value.diagnostics, info.value.message
  assert not deps.exists()


def tasks_of_uid(uid: int) -> int:
  n = 0
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if os.stat(f"/proc/{pid}").st_uid == uid:
        n += len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
      pass
  return n


def test_the_process_limit(nobody_dir, tmp_path):
  cfg = tmp_path / "c.toml"
  cfg.write_text("compile_max_processes = 1\n")
  d = kregd_proc.start_test_daemon("kreg-compile-nproc-",
                                   ["--config", str(cfg)])
  try:
    # The limit is counted on top of the uid's tasks when the compile
    # starts (RLIMIT_NPROC counts them all): let an earlier test's uid-65534
    # processes (executors, clients) finish first, or one that exits
    # during the compile leaves it room to spare.
    deadline = time.monotonic() + 20
    while tasks_of_uid(65534) and time.monotonic() < deadline:
      time.sleep(0.1)
    src = nobody_dir / "n.cc"
    src.write_text("int x;\n")
    os.chmod(src, 0o644)
    p = as_nobody(d, nobody_dir, "cc.nproc", "f", str(src))
    assert p.returncode == 1, p.stdout + p.stderr
    assert ("it hit the process limit of 1 processes at once "
            "(compile_max_processes)") in p.stderr, p.stderr
  finally:
    kregd_proc.finish_test_daemon(d)


def test_kregctl_compile_and_status(daemon, tmp_path):
  (tmp_path / "k.cc").write_text(unique(AXPB))
  (tmp_path / "axpb.h").write_text(AXPB_H)
  args = ("compile", "cc.ctl", "AxpbHandler", str(tmp_path / "k.cc"),
          "--header", str(tmp_path / "axpb.h"), "--option=-DKREG_B=3.0f")
  p = kregd_proc.run_kregctl(daemon, *args, "--json")
  out = json.loads(p.stdout)
  assert out["created"] and not out["cache_hit"]
  assert out["target"]["content_id"] == out["cache_key"]
  p = kregd_proc.run_kregctl(daemon, *args)
  assert p.stdout.startswith("already registered cc.ctl (cpu): AxpbHandler, "
                             f"content_id {out['cache_key']} (cache hit")
  p = kregd_proc.run_kregctl(daemon, "status")
  assert "compiles: " in p.stdout and "compile_cache_entries: " in p.stdout
  # In kregd's order, not alphabetical: version and uptime first.
  assert p.stdout.startswith("version: "), p.stdout
  assert p.stdout.splitlines()[1].startswith("uptime_s: "), p.stdout
  p = kregd_proc.run_kregctl(daemon, "compile", "cc.ctl", "AxpbHandler",
                             str(tmp_path / "missing.cc"), check=False)
  assert p.returncode == 1 and "no such file" in p.stderr


def scoped_hex(key: str, uid: int) -> str:
  import hashlib  # pylint: disable=import-outside-toplevel
  import struct  # pylint: disable=import-outside-toplevel
  h = hashlib.sha256()
  for tag, text in (("K", key), ("U", str(uid))):
    data = text.encode()
    h.update(tag.encode() + struct.pack("<Q", len(data)) + data)
  return h.hexdigest()


def test_gc_trims_the_compile_cache_least_recently_used_first(tmp_path):
  cfg = tmp_path / "c.toml"
  # Room for about two modules of ~60 KB; gc trims to half of it.
  cfg.write_text("compile_cache_bytes = 150000\n")
  d = kregd_proc.start_test_daemon("kreg-compile-gc-",
                                   ["--config", str(cfg)])
  try:
    client = kreg.Client(d.socket)  # the default stays the module's kregd
    keys = []
    for i in range(3):
      r = client.compile_ffi_target(f"cc.gc{i}", {"k.cc": unique(AXPB)},
                                    "AxpbHandler", platform="cpu",
                                    headers={"axpb.h": AXPB_H})
      keys.append(r.cache_key)
      time.sleep(0.05)
    cache = pathlib.Path(d.state_dir) / "compile"
    names = {p.name for p in cache.glob("*.so")}
    # Cache files are named by the key scoped to the caller's uid
    # (CallerScopedKey, daemon/compile_service/compile_request.h).
    hexes = [scoped_hex(k, os.getuid()) + ".so" for k in keys]
    # The size bound evicted the least recently used (the first).
    assert hexes[0] not in names and hexes[2] in names, names
    p = kregd_proc.run_kregctl(d, "gc")
    assert "compile cache: removed 1 files" in p.stdout, p.stdout
    assert {p.name for p in cache.glob("*.so")} == {hexes[2]}
    assert d.status()["compile_cache_entries"] == 1
  finally:
    kregd_proc.finish_test_daemon(d)


def test_the_user_guide_compile_once_example_runs_as_written():
  # docs/user-guide.md "Compile once": five lines, verbatim, from the
  # repository root, in a fresh process against a fresh kregd.
  text = (ku.REPO_ROOT / "docs/user-guide.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  block = [b for b in blocks if "kreg.compile_ffi_target(" in b]
  assert len(block) == 1 and len(block[0].strip().splitlines()) <= 5
  # The README shows the same lines.
  readme = (ku.REPO_ROOT / "README.md").read_text()
  assert block[0] in re.findall(r"```python\n(.*?)```", readme, re.S)
  d = kregd_proc.start_test_daemon("kreg-compile-guide-")
  # As the README says for the source tree: only client/python on
  # PYTHONPATH; kreg finds the shim and kreg.v1 in bazel-bin itself.
  env = dict(d.env(), PYTHONPATH=str(ku.REPO_ROOT / "client" / "python"))
  try:
    for hit in ("False", "True"):
      r = subprocess.run([sys.executable, "-c", block[0]], env=env,
                         cwd=ku.REPO_ROOT, capture_output=True, text=True,
                         timeout=300)
      assert r.returncode == 0, r.stderr
      assert r.stdout.strip() == f"[0.5 2.5 4.5 6.5] {hit}", r.stdout
  finally:
    kregd_proc.finish_test_daemon(d)


def test_compiles_are_counted_in_prometheus_metrics(tmp_path):
  import socket  # pylint: disable=import-outside-toplevel
  d = kregd_proc.start_test_daemon("kreg-compile-metrics-")
  d.stop()
  metrics = d.root / "metrics.sock"
  d.extra_args += ["--metrics-listen", f"unix:{metrics}"]
  d.start()
  try:
    client = kreg.Client(d.socket)  # the default stays the module's kregd
    src = {"k.cc": unique(AXPB)}
    for name in ("cc.m1", "cc.m2"):
      client.compile_ffi_target(name, src, "AxpbHandler", platform="cpu",
                                headers={"axpb.h": AXPB_H})
    with pytest.raises(kreg.CompileError):
      client.compile_ffi_target("cc.m3", {"k.cc": "int f( {"}, "f",
                                platform="cpu")
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(metrics))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: kregd\r\n\r\n")
    body = b""
    while chunk := s.recv(65536):
      body += chunk
    s.close()
    text = body.decode()
    assert "\nkregd_compiles_total 2\n" in text, text
    assert 'kregd_compile_requests_total{outcome="cache_hit"} 1' in text
    assert 'kregd_compile_requests_total{outcome="failed"} 1' in text
    assert 'kregd_compile_requests_total{outcome="queue_full"} 0' in text
    assert 'kregd_compile_requests_total{outcome="abandoned"} 0' in text
    assert "# TYPE kregd_compiles_total counter" in text
  finally:
    kregd_proc.finish_test_daemon(d)


def test_a_kregd_that_is_not_root_compiles_unsandboxed_and_says_so(
    nobody_dir):
  # kregd as uid 65534: the worker cannot change uid or make namespaces; it
  # compiles as kregd's uid with the limits, and kregd's log says so.
  bindir = nobody_dir / "bin"
  bindir.mkdir()
  for rel in ("daemon/kregd/kregd", "daemon/executor/kregd-probe",
              "daemon/executor/kregd-exec", "daemon/kregd_compile/kregd-compile"):
    src = kregd_proc.daemon_binary().parents[2] / rel
    shutil.copy(src, bindir / src.name)
    os.chmod(bindir / src.name, 0o755)
  # The XLA FFI headers kregd ships beside itself (compile_ffi_include_dir).
  shutil.copytree(kregd_proc.daemon_binary().parent / "include",
                  bindir / "include")
  home = nobody_dir / "kregd"
  home.mkdir()
  os.chown(home, 65534, 65534)
  sock = home / "kregd.sock"
  log = open(home / "kregd.log", "wb")
  proc = subprocess.Popen(
      [str(bindir / "kregd"), "--socket", str(sock), "--state-dir",
       str(home / "state"), "--orphan-timeout", "0"],
      stdout=log, stderr=log, user=65534, group=65534, extra_groups=[],
      env={"PATH": "/usr/bin:/bin", "TMPDIR": str(home)})
  try:
    deadline = time.monotonic() + 30
    while not os.path.exists(str(sock) + ".session"):
      assert proc.poll() is None and time.monotonic() < deadline, (
          home / "kregd.log").read_text()
      time.sleep(0.05)
    reg = kreg.Client(str(sock)).compile_ffi_target(
        "cc.nonroot", {"k.cc": unique(AXPB)}, "AxpbHandler", platform="cpu",
        headers={"axpb.h": AXPB_H})
    assert reg.created
    text = (home / "kregd.log").read_text()
    assert ("kregd is not root: compile workers run as kregd's uid 65534, "
            "not as their callers'") in text, text
    assert "not sandboxed (kregd is not root), as kregd's uid 65534" in text
    # Its scratch directory is gone.
    assert not list(home.glob("kregd-compile-*"))
  finally:
    proc.terminate()
    proc.wait(timeout=20)
    log.close()


def test_a_sandbox_that_cannot_be_set_up_says_what_kregd_needs(nobody_dir):
  # The worker itself, asked for a sandbox without the rights for one.
  from kreg.v1 import compile_pb2 as pb, registry_pb2  # pylint: disable=import-outside-toplevel
  worker = nobody_dir / "kregd-compile"
  shutil.copy(
      kregd_proc.daemon_binary().parents[1] / "kregd_compile" / "kregd-compile",
      worker)
  os.chmod(worker, 0o755)
  job = pb.CompileJob(compiler="/usr/bin/g++", sandbox=True,
                      sources=[registry_pb2.SourceFile(name=b"k.cc",
                                                       text=b"int x;")])
  p = subprocess.run([str(worker)], input=job.SerializeToString(),
                     capture_output=True, timeout=60, user=65534, group=65534,
                     extra_groups=[])
  answer = pb.CompileJobResult.FromString(p.stdout)
  assert answer.code == 9, answer  # FAILED_PRECONDITION
  message = answer.message
  assert message.startswith("the compile sandbox could not be set up "
                            "(sandbox: unshare("), message
  assert "CAP_SYS_ADMIN" in message and "RestrictNamespaces=mnt net ipc pid" in (
      message)
  # And garbage instead of a job: INVALID_ARGUMENT, not a crash.
  p = subprocess.run([str(worker)], input=b"\xff\xff\xff", capture_output=True,
                     timeout=60)
  assert pb.CompileJobResult.FromString(p.stdout).code == 3


def test_kregd_stops_promptly_while_a_compile_runs():
  # A compile that would run for minutes (an include that never ends) must
  # not hold kregd's shutdown: its worker is stopped and the caller told.
  import threading  # pylint: disable=import-outside-toplevel
  d = kregd_proc.start_test_daemon("kreg-compile-stop-")
  fifo_dir = pathlib.Path(tempfile.mkdtemp(prefix="kreg-fifo-",
                                           dir="/var/tmp"))
  try:
    fifo = fifo_dir / "never_written"
    os.mkfifo(fifo)
    os.chmod(fifo_dir, 0o755)
    os.chmod(fifo, 0o666)
    errors = []
    source = f"forever_{uuid.uuid4().hex}.cc"  # found in ps below

    def compile_forever():
      try:
        kreg.Client(d.socket).compile_ffi_target(
            "cc.forever", {source: f'#include "{fifo}"\n'}, "f",
            platform="cpu")
      except kreg.KregError as e:
        errors.append(e)

    t = threading.Thread(target=compile_forever)
    t.start()
    deadline = time.monotonic() + 30
    while source not in subprocess.run(
        ["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout:
      assert time.monotonic() < deadline, d.log()
      time.sleep(0.1)
    start = time.monotonic()
    d.stop()
    assert time.monotonic() - start < 15, d.log()
    t.join(timeout=30)
    assert not t.is_alive()
    assert errors and errors[0].code in ("CANCELLED", "UNAVAILABLE"), errors
    # Nothing of the compile is left (cc1plus reading the FIFO included).
    deadline = time.monotonic() + 10
    while source in subprocess.run(["ps", "-eww", "-o", "args"],
                                   capture_output=True, text=True).stdout:
      assert time.monotonic() < deadline, "the compiler outlived its worker"
      time.sleep(0.1)
  finally:
    shutil.rmtree(fifo_dir, ignore_errors=True)
    kregd_proc.finish_test_daemon(d)


def test_a_missing_ffi_include_dir_stops_kregd_at_start_naming_the_key(
    tmp_path):
  # The compile service would fail every compile: kregd says so at start.
  empty = tmp_path / "no-headers"
  empty.mkdir()
  (tmp_path / "k.toml").write_text(f'compile_ffi_include_dir = "{empty}"\n')
  r = subprocess.run(
      [str(kregd_proc.daemon_binary()), "--socket", str(tmp_path / "k.sock"),
       "--state-dir", str(tmp_path / "state"), "--orphan-timeout", "0",
       "--config", str(tmp_path / "k.toml")],
      stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
  assert r.returncode != 0, r.stderr
  assert "compile_ffi_include_dir" in r.stderr, r.stderr
  assert f"no xla/ffi/api/ffi.h under {empty}" in r.stderr, r.stderr


# -- the queue, the content_id prefix, the sandbox (operator guide, "The compile service")

def daemon_with(tmp_path, prefix: str, toml: str):
  cfg = tmp_path / f"{prefix}.toml"
  cfg.write_text(toml)
  return kregd_proc.start_test_daemon(f"kreg-{prefix}-", ["--config", str(cfg)])


@pytest.fixture
def fifos():
  """make(name): a FIFO under /var/tmp anyone may open; release(path) lets
  the compile reading it go on (an empty include)."""
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-fifo-", dir="/var/tmp"))
  os.chmod(root, 0o755)
  made = []

  def make(name: str) -> pathlib.Path:
    path = root / name
    os.mkfifo(path)
    os.chmod(path, 0o666)
    made.append(path)
    return path

  yield make
  for path in made:  # nobody blocks on them any more
    try:
      os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
      pass
  shutil.rmtree(root, ignore_errors=True)


def release(fifo: pathlib.Path, timeout: float = 60) -> None:
  """Opens `fifo` for writing once its compile has it open, then closes it."""
  deadline = time.monotonic() + timeout
  while True:
    try:
      os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
      return
    except OSError:  # ENXIO: no reader yet
      assert time.monotonic() < deadline, f"nobody read {fifo}"
      time.sleep(0.1)


def wait_for(what, timeout: float = 60, step: float = 0.1):
  deadline = time.monotonic() + timeout
  while not what():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(step)


def fifo_source(fifo: pathlib.Path) -> str:
  return unique(f'#include "{fifo}"\nint x;\n')


def start_compile(d, name: str, text: str, errors: list):
  """A compile on a thread; its KregError (if any) lands in `errors`."""
  import threading  # pylint: disable=import-outside-toplevel

  def run():
    try:
      kreg.Client(d.socket).compile_ffi_target(name, {"k.cc": text}, "f",
                                               platform="cpu")
    except kreg.KregError as e:
      errors.append(e)

  t = threading.Thread(target=run, daemon=True)
  t.start()
  return t


QUEUE_TOML = "max_parallel_compiles = 1\ncompile_timeout_s = 300.0\n"


def test_a_uids_queue_is_bounded_and_the_refusal_names_the_limit(
    tmp_path, fifos):
  d = daemon_with(tmp_path, "cqueue",
                  QUEUE_TOML + "compile_max_queued_per_uid = 1\n")
  try:
    errors = []
    running = start_compile(d, "cc.q1", fifo_source(fifos("q1")), errors)
    wait_for(lambda: compiles(d) == 1)
    queued = start_compile(d, "cc.q2", unique("int q2;\n"), errors)
    wait_for(lambda: d.status()["compile_requests"] == 2)
    time.sleep(0.5)
    with pytest.raises(kreg.KregError) as info:
      kreg.Client(d.socket).compile_ffi_target(
          "cc.q3", {"k.cc": unique("int q3;\n")}, "f", platform="cpu",
          timeout=60)
    assert info.value.code == "RESOURCE_EXHAUSTED"
    assert (f"compile of target \"cc.q3\" refused: uid {os.getuid()} already "
            "has 1 compile requests waiting, the limit "
            "(compile_max_queued_per_uid)") in info.value.message
    assert compiles(d) == 1  # nothing more ran for it
  finally:
    kregd_proc.finish_test_daemon(d)
  running.join(timeout=30)
  queued.join(timeout=30)


def test_the_queued_bytes_are_bounded(tmp_path, fifos):
  d = daemon_with(tmp_path, "cqbytes",
                  QUEUE_TOML + "compile_max_queued_bytes = 1048576\n")
  try:
    errors = []
    start_compile(d, "cc.b1", fifo_source(fifos("b1")), errors)
    wait_for(lambda: compiles(d) == 1)
    big = unique("int b2;\n") + "//" + "x" * (2 << 20) + "\n"
    with pytest.raises(kreg.KregError) as info:
      kreg.Client(d.socket).compile_ffi_target("cc.b2", {"k.cc": big}, "f",
                                               platform="cpu", timeout=60)
    assert info.value.code == "RESOURCE_EXHAUSTED"
    assert ("over the limit of 1048576 bytes (compile_max_queued_bytes)"
            in info.value.message), info.value.message
  finally:
    kregd_proc.finish_test_daemon(d)


def kregctl_compile(d, tmp_path, name: str, text: str, **kw):
  """`kregctl compile NAME f k.cc` as a child process (Popen)."""
  src = tmp_path / f"{name}.cc"
  src.write_text(text)
  os.chmod(src, 0o644)
  return subprocess.Popen(
      [str(kregd_proc.kregctl_binary()), "--socket", d.socket, "compile", name,
       "f", str(src)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, **kw)


def ps_args() -> str:
  return subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True,
                        text=True).stdout


def test_a_compile_whose_caller_went_away_is_dropped_or_stopped(
    tmp_path, fifos):
  if kregd_proc.kregctl_binary() is None:
    pytest.skip("kregctl not built")
  d = daemon_with(tmp_path, "cgone", QUEUE_TOML)
  try:
    fifo = fifos("g1")
    first = kregctl_compile(d, tmp_path, "cc.g1", fifo_source(fifo))
    wait_for(lambda: compiles(d) == 1)
    # Queued behind it, then its client dies: dropped, never compiled.
    gone = kregctl_compile(d, tmp_path, "cc.g2", unique("int g2;\n"))
    wait_for(lambda: d.status()["compile_requests"] == 2)
    gone.kill()
    gone.wait()
    wait_for(lambda: 'compile of "cc.g2" for uid' in d.log(None) and
             "its caller went away" in d.log(None))
    release(fifo)
    assert first.wait(timeout=120) is not None
    # The next compile runs right after the first: the dropped one did not.
    # (It has no symbol "f": compiled, then refused by registration.)
    with pytest.raises(kreg.InvalidArgumentError):
      kreg.Client(d.socket).compile_ffi_target(
          "cc.g3", {"k.cc": unique("int g3;\n")}, "f", platform="cpu")
    assert compiles(d) == 2, d.log()
    # A running compile whose only caller dies is stopped (its worker and
    # the compiler reading the FIFO are killed), not run to its 300 s.
    source = f"forever_{uuid.uuid4().hex}"
    running = kregctl_compile(d, tmp_path, source, fifo_source(fifos("g4")))
    wait_for(lambda: source in ps_args())
    running.kill()
    running.wait()
    wait_for(lambda: source not in ps_args(), timeout=30)
  finally:
    kregd_proc.finish_test_daemon(d)


def kregd_threads(d) -> int:
  for line in pathlib.Path(f"/proc/{d.pid}/status").read_text().splitlines():
    if line.startswith("Threads:"):
      return int(line.split()[1])
  raise AssertionError("no Threads: line")


def test_queued_requests_do_not_each_hold_a_kregd_thread(tmp_path, fifos):
  d = daemon_with(tmp_path, "cthreads", QUEUE_TOML +
                  "compile_max_queued = 4\ncompile_max_queued_per_uid = 100\n")
  try:
    errors = []
    start_compile(d, "cc.t0", fifo_source(fifos("t0")), errors)
    wait_for(lambda: compiles(d) == 1)
    before = kregd_threads(d)
    threads = [start_compile(d, f"cc.t{i}", unique(f"int t{i};\n"), errors)
               for i in range(1, 61)]
    # Every request either waits (4) or is refused at once.
    wait_for(lambda: len(errors) >= 56, timeout=120)
    assert all(e.code == "RESOURCE_EXHAUSTED" and "(compile_max_queued)" in
               e.message for e in errors), [e.message for e in errors[:3]]
    time.sleep(1)
    assert kregd_threads(d) <= before + 4 + 20, (before, kregd_threads(d))
    assert compiles(d) == 1
  finally:
    kregd_proc.finish_test_daemon(d)
  for t in threads:
    t.join(timeout=30)


def test_one_uids_queue_does_not_starve_another_uid(tmp_path, fifos,
                                                    nobody_dir):
  d = daemon_with(tmp_path, "cfair", QUEUE_TOML)
  try:
    errors = []
    a = [fifos(f"a{i}") for i in range(4)]
    start_compile(d, "cc.a0", fifo_source(a[0]), errors)
    wait_for(lambda: compiles(d) == 1)
    for i in (1, 2, 3):  # root's queue: each would hold the slot for 300 s
      start_compile(d, f"cc.a{i}", fifo_source(a[i]), errors)
    wait_for(lambda: d.status()["compile_requests"] == 4)
    src = nobody_dir / "b.cc"
    src.write_text(unique(AXPB).replace('#include "axpb.h"',
                                        "#define KREG_B 1.0f"))
    os.chmod(src, 0o644)
    import threading  # pylint: disable=import-outside-toplevel
    result = []
    b = threading.Thread(target=lambda: result.append(as_nobody(
        d, nobody_dir, "cc.b", "AxpbHandler", str(src))), daemon=True)
    b.start()
    wait_for(lambda: d.status()["compile_requests"] == 5)
    release(a[0])
    # uid 65534's compile is next, ahead of root's three queued ones.
    b.join(timeout=100)
    assert result, "uid 65534's compile waited behind root's queue"
    assert result[0].returncode == 0, result[0].stdout + result[0].stderr
    assert compiles(d) <= 3  # a0, b, and perhaps a1 (root's next) by now
  finally:
    kregd_proc.finish_test_daemon(d)


def test_a_kcc_content_id_is_the_compile_services_own(daemon, tmp_path):
  key = kreg.compile_ffi_target("cc.kcc.real", {"k.cc": unique(AXPB)},
                                "AxpbHandler", platform="cpu",
                                headers={"axpb.h": AXPB_H}).content_id
  assert key.startswith("kcc-sha256:")
  want = (f"content_id \"{key}\" starts with \"kcc-\", which is reserved for "
          "modules kregd compiled itself (kreg.compile_ffi_target, kregctl "
          "compile)")
  demo = ku.kernel_path(ku.DEMO)
  # An upload claiming the compile's key (gRPC and the session path).
  with pytest.raises(kreg.InvalidArgumentError) as info:
    kreg.register_ffi_target("cc.kcc.spoof", demo.read_bytes(), "Scale",
                             platform="cpu", content_id=key)
  assert info.value.code == "INVALID_ARGUMENT"
  assert want in info.value.message, info.value.message
  p = kregd_proc.run_kregctl(daemon, "register", "cc.kcc.spoof2", "--module",
                             str(demo), "--function", "Scale", "--platform",
                             "cpu", "--content-id", key.upper(), check=False)
  assert p.returncode != 0 and "is reserved for modules kregd compiled" in (
      p.stdout + p.stderr), p.stdout + p.stderr
  # A compile request cannot name another compile's key either.
  before = compiles(daemon)
  with pytest.raises(kreg.KregError) as info:
    kreg.compile_ffi_target("cc.kcc.spoof3", {"k.cc": unique("int s;\n")},
                            "f", platform="cpu", content_id=key)
  assert info.value.code == "INVALID_ARGUMENT"
  assert "reserved for modules kregd compiled" in info.value.message
  assert compiles(daemon) == before
  assert not [t for t in kreg.list_registered_targets()
              if t.target_name.startswith("cc.kcc.spoof")]


def test_a_refusal_names_each_module_by_its_own_origin(daemon, nobody_dir):
  # root compiles k.cc under a content_id of its own; uid 65534 uploads
  # other bytes claiming it: the refusal names the upload by its file and
  # the compiled module by its digest and origin, never the upload as
  # "compiled from k.cc".
  cid = f"cid-{uuid.uuid4().hex}"
  reg = kreg.compile_ffi_target("cc.label", {"k.cc": unique(AXPB)},
                                "AxpbHandler", platform="cpu",
                                headers={"axpb.h": AXPB_H}, content_id=cid)
  compiled = reg.target.module_digest
  demo = nobody_dir / "libdemo_copy.so"
  shutil.copy(ku.kernel_path(ku.DEMO), demo)
  os.chmod(demo, 0o644)
  exe = nobody_dir / "kregctl"
  shutil.copy(kregd_proc.kregctl_binary(), exe)
  os.chmod(exe, 0o755)
  os.chmod(daemon.root, 0o711)
  p = subprocess.run([str(exe), "--socket", daemon.socket, "register",
                      "cc.label", "--module", str(demo), "--function",
                      "AxpbHandler",
                      "--platform", "cpu", "--content-id", cid],
                     capture_output=True, text=True, timeout=120, user=65534,
                     group=0, extra_groups=[], cwd="/")
  out = p.stdout + p.stderr
  assert p.returncode != 0, out
  assert "compiled from" not in out, out
  assert f"module {compiled} (compile:k.cc, " in out, out
  assert re.search(r'module "[^"]*libdemo_copy\.so" \(sha256:', out), out


def test_the_compile_sandbox_hides_the_host_and_filters_system_calls(
    daemon, tmp_path):
  if os.geteuid() != 0:
    pytest.skip("needs root: kregd sandboxes compiles only as root")
  # The host's /tmp (kregd's directory is under it) through kregd's
  # /proc/<pid>/root: the compile has its own /proc, where no such pid is.
  marker = daemon.root / "marker.h"
  marker.write_text("#define KREG_SEEN 1\n")
  os.chmod(marker, 0o644)
  with pytest.raises(kreg.CompileError) as info:
    kreg.compile_ffi_target(
        "cc.procroot",
        {"k.cc": unique(f'#include "/proc/{daemon.pid}/root{marker}"\n')},
        "f", platform="cpu")
  assert "No such file or directory" in info.value.diagnostics, (
      info.value.diagnostics)
  # What runs in the compile (here a -wrapper around cc1plus) may not open
  # an AF_INET socket, ptrace or make namespaces.
  script = "\n".join([
      "import ctypes, os, socket",
      "out = []",
      "try:",
      "  socket.socket(socket.AF_INET, socket.SOCK_STREAM)",
      "  out.append('inet:0')",
      "except OSError as e:",
      "  out.append('inet:%d' % e.errno)",
      "libc = ctypes.CDLL(None, use_errno=True)",
      "for name, call in (('ptrace', lambda: libc.ptrace(0, 0, 0, 0)),",
      "                   ('unshare', lambda: libc.unshare(0x40000000))):",
      "  out.append('%s:%d' % (name, ctypes.get_errno() if call() else 0))",
      "print('probe ' + ' '.join(out), flush=True)",
      "os._exit(1)"])
  wrapper = ("/usr/bin/python3,-c,exec(bytes.fromhex('" +
             script.encode().hex() + "').decode())")
  with pytest.raises(kreg.CompileError) as info:
    kreg.compile_ffi_target("cc.probe", {"k.cc": unique("int p;\n")}, "f",
                            platform="cpu", options=("-wrapper", wrapper))
  assert "probe inet:1 ptrace:1 unshare:1" in info.value.diagnostics, (
      info.value.diagnostics)
