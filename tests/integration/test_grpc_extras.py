"""kregd's standard gRPC extras, checked with stock Python gRPC clients
(grpcio, grpcio-reflection, grpcio-health-checking), as grpcurl would use
them: server reflection lists and describes kreg.v1.Registry, and the
grpc.health.v1 service answers SERVING.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (  # noqa: E402
    ProtoReflectionDescriptorDatabase)

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("KREG_BIN_DIR", REPO / "bazel-bin"))
KREGD = BIN_DIR / "daemon" / "kregd" / "kregd"


@pytest.fixture
def channel():
  if not KREGD.exists():
    pytest.skip(f"{KREGD} is not built (bazel build //daemon/kregd:kregd)")
  d = Path(tempfile.mkdtemp(prefix="kreg-grpc-", dir="/tmp"))
  sock = d / "k.sock"
  proc = subprocess.Popen([str(KREGD), "--socket", str(sock), "--state-dir",
                           str(d / "state")], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    deadline = time.monotonic() + 20
    while not sock.exists() and time.monotonic() < deadline:
      time.sleep(0.02)
    assert sock.exists(), "kregd did not create its socket"
    with grpc.insecure_channel(f"unix:{sock}") as ch:
      grpc.channel_ready_future(ch).result(timeout=20)
      yield ch
  finally:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    shutil.rmtree(d, ignore_errors=True)


def test_reflection_lists_and_describes_the_registry(channel):
  db = ProtoReflectionDescriptorDatabase(channel)
  services = set(db.get_services())
  assert "kreg.v1.Registry" in services
  assert "grpc.health.v1.Health" in services
  desc = db.FindFileContainingSymbol("kreg.v1.Registry")
  names = [m.name for m in desc.service[0].method] if desc.service else []
  assert {"RegisterTarget", "ListTargets", "GetTarget", "GetStatus"} <= set(names)


def test_health_service_reports_serving(channel):
  stub = health_pb2_grpc.HealthStub(channel)
  resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
  assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_health_reports_the_registry_service_by_name(channel):
  stub = health_pb2_grpc.HealthStub(channel)
  resp = stub.Check(health_pb2.HealthCheckRequest(service="kreg.v1.Registry"),
                    timeout=10)
  assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_health_of_an_unknown_service_is_not_found(channel):
  stub = health_pb2_grpc.HealthStub(channel)
  with pytest.raises(grpc.RpcError) as err:
    stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"),
               timeout=10)
  assert err.value.code() == grpc.StatusCode.NOT_FOUND
