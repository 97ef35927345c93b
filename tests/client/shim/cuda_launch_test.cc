// The shim's CUDA launch path (client/shim/cuda_launch.cc) over the fake CUDA
// driver against a fake kregd: a session socket and launch ring served by
// threads of this test, written against session.proto and ring_layout.h
// only. Checks which launches go on the socket and which on the ring, the
// ring descriptor's CUDA fields, the doorbell operations on XLA's stream,
// the mapping-missing retry, and the asynchronous mode (KREG_ASYNC_LAUNCH=1):
// no wait for the completion, an error on the session's next call naming
// the target, and ring launches completed before anything goes on the
// socket.
#include "client/shim/cuda_launch.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "client/shim/cuda/cuda_export.h"
#include "client/shim/conn.h"
#include "client/shim/cuda_conn_state.h"
#include "common/ring_encode.h"
#include "common/ring_layout.h"
#include "common/wire.h"
#include "kreg/v1/session.pb.h"
#include "tests/client/shim/temp_socket.h"
#include "tests/testing/fake_cuda.h"
#include "xla/ffi/api/c_api.h"

namespace kreg::shim {
namespace {

using ::kreg::testing::FakeCuda;

// What a ring descriptor carried (the fake executor's copy).
struct RingSeen {
  std::string target, platform, device_uuid;
  uint64_t doorbell_seq = 0;
  uint32_t flags = 0;
  uint64_t tag = 0;
  std::vector<ring::CudaRef> refs;
  std::vector<uint64_t> offsets;
  std::vector<std::vector<int64_t>> dims;
  std::vector<int32_t> dtypes;
  int64_t run_id = 0;
  int32_t device_ordinal = 0;
  std::string attrs;
};

// Reads a descriptor the client library wrote (trusted here).
RingSeen Parse(const char* d) {
  ring::SubmitHeader h;
  std::memcpy(&h, d, sizeof(h));
  RingSeen seen;
  const char* p = d + sizeof(h);
  seen.target.assign(p, h.target_len);
  p += h.target_len;
  seen.platform.assign(p, h.platform_len);
  seen.device_uuid.assign(reinterpret_cast<const char*>(h.device_uuid), 16);
  seen.doorbell_seq = h.doorbell_seq;
  seen.flags = h.flags;
  seen.tag = h.tag;
  size_t at = (sizeof(h) + h.target_len + h.platform_len + 7) / 8 * 8;
  for (uint32_t i = 0; i < h.num_args + h.num_rets; ++i) {
    ring::BufferDesc b;
    ring::CudaRef r;
    std::memcpy(&b, d + at, sizeof(b));
    std::memcpy(&r, d + at + sizeof(b), sizeof(r));
    std::vector<int64_t> dims(b.rank);
    std::memcpy(dims.data(), d + at + sizeof(b) + sizeof(r),
                b.rank * sizeof(int64_t));
    at += sizeof(b) + sizeof(r) + b.rank * sizeof(int64_t);
    seen.refs.push_back(r);
    seen.offsets.push_back(b.offset);
    seen.dims.push_back(dims);
    seen.dtypes.push_back(b.dtype);
  }
  seen.attrs.assign(d + at, h.attrs_len);
  seen.run_id = h.run_id;
  seen.device_ordinal = h.device_ordinal;
  return seen;
}

// A socket Launch: its side data and its descriptor.
struct SocketSeen {
  kreg::v1::Launch launch;
  RingSeen desc;
};

// A fake kregd: one session, served like an executor serves it (the socket
// on one thread, the ring on another), recording what it got.
class FakeKregd {
 public:
  FakeKregd() {
    path = listener_.path;
    socket_thread_ = std::thread([this] { Serve(); });
  }
  ~FakeKregd() {
    stop_ = true;
    ::shutdown(listener_.fd, SHUT_RDWR);
    if (sock_ >= 0) ::shutdown(sock_, SHUT_RDWR);
    socket_thread_.join();
    if (ring_thread_.joinable()) {
      ring::FutexWake(&ring::ControlOf(ring_)->sq_tail);
      ring_thread_.join();
    }
    if (ring_ != nullptr) ::munmap(ring_, ring::kRegionBytes);
    if (sock_ >= 0) ::close(sock_);
  }

  using OnRing = std::function<void(const RingSeen&, int* code,
                                    std::string* message, uint32_t* flags)>;
  std::string uuid = FakeCuda::Uuid(0xa0);
  // How the ring answers a descriptor (default: OK, doorbell signalled).
  // Set while the ring thread runs (an asynchronous launch may still be in
  // flight), so under mu.
  void SetOnRing(OnRing f) {
    std::lock_guard<std::mutex> l(mu);
    on_ring = std::move(f);
  }
  // Completions wait this long (to show what the client waits for).
  void SetRingDelay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> l(mu);
    ring_delay = d;
  }

  std::string path;
  std::mutex mu;
  OnRing on_ring;                           // guarded by mu
  std::chrono::milliseconds ring_delay{0};  // guarded by mu
  std::vector<SocketSeen> socket_launches;  // guarded by mu
  std::vector<RingSeen> ring_launches;      // guarded by mu
  std::vector<std::string> order;           // "ring N" / "socket N"
  size_t ring_count() {
    std::lock_guard<std::mutex> l(mu);
    return ring_launches.size();
  }
  size_t socket_count() {
    std::lock_guard<std::mutex> l(mu);
    return socket_launches.size();
  }

 private:
  void Serve() {
    sock_ = ::accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (sock_ < 0) return;
    std::string in;
    for (;;) {
      std::vector<int> fds;
      if (wire::RecvFrame(sock_, 64 << 20, &in, &fds) != wire::kOk) return;
      kreg::v1::SessionRequest req;
      REQUIRE(req.ParseFromString(in));
      kreg::v1::SessionResponse resp;
      resp.set_id(req.id());
      switch (req.body_case()) {
        case kreg::v1::SessionRequest::kHello: {
          kreg::v1::HelloReply* h = resp.mutable_hello();
          h->set_session_id(1);
          h->set_protocol_major(2);
          h->set_max_arena_bytes(1 << 20);
          h->set_max_message_bytes(64 << 20);
          h->set_max_cuda_mappings(256);
          h->add_cuda_device_uuids(uuid);
          h->set_cuda_doorbell(true);
          h->set_launch_ring(ring::kVersion);
          break;
        }
        case kreg::v1::SessionRequest::kRingSetup: {
          REQUIRE(fds.size() == 1);
          REQUIRE(req.ring_setup().version() == ring::kVersion);
          void* p = ::mmap(nullptr, ring::kRegionBytes, PROT_READ | PROT_WRITE,
                           MAP_SHARED, fds[0], 0);
          REQUIRE(p != MAP_FAILED);
          ring_ = static_cast<char*>(p);
          // The indices start where the client's are now, before the reply
          // (as LaunchRing::Map does), not whenever the thread starts.
          const uint32_t start = ring::Load(ring::ControlOf(ring_)->sq_tail);
          cq_tail_ = start;
          ring_thread_ = std::thread([this, start] { ServeRing(start); });
          resp.mutable_ring_setup();
          break;
        }
        case kreg::v1::SessionRequest::kCudaDoorbell:
          REQUIRE(fds.size() == 1);
          resp.mutable_cuda_doorbell();
          break;
        case kreg::v1::SessionRequest::kCudaShare:
          resp.mutable_cuda_share();
          break;
        case kreg::v1::SessionRequest::kLaunch: {
          std::lock_guard<std::mutex> l(mu);
          SocketSeen seen{req.launch(),
                          Parse(req.launch().descriptor().data())};
          socket_launches.push_back(seen);
          order.push_back("socket " + std::to_string(seen.desc.doorbell_seq));
          resp.mutable_launch()->set_doorbell_signalled(seen.desc.doorbell_seq >
                                                        0);
          break;
        }
        default:
          resp.mutable_status()->set_code(3);
          resp.mutable_status()->set_message("fake kregd: unexpected request");
      }
      for (int fd : fds) ::close(fd);
      std::string out = resp.SerializeAsString();
      if (wire::SendFrame(sock_, out.data(), out.size(), nullptr, 0) !=
          wire::kOk) {
        return;
      }
    }
  }

  void ServeRing(uint32_t head) {
    ring::Control* c = ring::ControlOf(ring_);
    ring::SpinPolicy spin(1000);
    while (!stop_) {
      const uint32_t tail = ring::Load(c->sq_tail);
      if (tail == head) {
        ring::SpinThenWait(&c->sq_tail, tail, &c->sq_waiting, &spin, 5'000'000);
        continue;
      }
      std::string d(ring::SubmitSlot(ring_, head), ring::kSubmitSlotBytes);
      RingSeen seen = Parse(d.data());
      ++head;
      ring::Store(c->sq_head, head);
      int code = 0;
      std::string message;
      uint32_t flags = ring::kDoneSignalled;
      OnRing answer;
      std::chrono::milliseconds delay;
      {
        std::lock_guard<std::mutex> l(mu);
        answer = on_ring;
        delay = ring_delay;
      }
      if (answer) answer(seen, &code, &message, &flags);
      std::this_thread::sleep_for(delay);
      {
        std::lock_guard<std::mutex> l(mu);
        ring_launches.push_back(seen);
        order.push_back("ring " + std::to_string(seen.doorbell_seq));
      }
      char* slot = ring::CompleteSlot(ring_, cq_tail_);
      ring::CompletionHeader ch{};
      ch.seq = head - 1;
      ch.code = code;
      ch.tag = seen.tag;
      ch.message_len = static_cast<uint32_t>(message.size());
      ch.flags = flags;
      std::memcpy(slot, &ch, sizeof(ch));
      std::memcpy(slot + sizeof(ch), message.data(), message.size());
      ++cq_tail_;
      ring::Store(c->cq_tail, cq_tail_);
      if (ring::Load(c->cq_waiting) != 0) ring::FutexWake(&c->cq_tail);
    }
  }

  TempSessionSocket listener_{"/tmp/kreg-shim-cuda.XXXXXX"};
  int sock_ = -1;
  std::thread socket_thread_, ring_thread_;
  std::atomic<bool> stop_{false};
  char* ring_ = nullptr;
  uint32_t cq_tail_ = 0;
};

cu::CUcontext Ctx() {
  return reinterpret_cast<cu::CUcontext>(static_cast<uintptr_t>(0x1000));
}

// The client: a session with the fake kregd and a forwarded call of
// "t.scale" (one f32[256] arg and ret, in one VMM allocation).
struct Client {
  explicit Client(FakeKregd* kregd, bool async,
                  const char* async_value = "force") {
    if (async) {
      ::setenv("KREG_ASYNC_LAUNCH", async_value, 1);
    } else {
      ::unsetenv("KREG_ASYNC_LAUNCH");
    }
    fake.driver()->cuCtxPushCurrent(Ctx());
    ClientStatus s = Conn::Open(kregd->path, &conn);
    INFO(s.message);
    REQUIRE(s.ok());
    REQUIRE(conn->ring());
    alloc = fake.ClientAllocation(FakeCuda::Kind::kVmmPosixFd, 1 << 20);
  }
  ~Client() {
    fake.CompleteAll();  // the doorbell's last use has passed
    conn.reset();
    cu::CUcontext c;
    fake.driver()->cuCtxPopCurrent(&c);
    ::unsetenv("KREG_ASYNC_LAUNCH");
  }
  // One call of `target` on [alloc + in, alloc + out); the input in
  // `in_alloc` instead when it is not 0.
  ClientStatus Launch(const std::string& target, uint64_t in = 0,
                      uint64_t out = 4096, uint64_t in_alloc = 0) {
    Call call;
    call.d = fake.driver();
    call.stream = reinterpret_cast<cu::CUstream>(uintptr_t{0xa000});
    call.ctx = Ctx();
    call.ordinal = 0;
    call.uuid = FakeCuda::Uuid(0xa0);
    call.target = &target;
    call.launch.target = target;
    call.launch.platform = "cuda";
    call.launch.device_uuid = call.uuid;
    call.launch.attrs = attrs;
    call.launch.run_id = 77;
    call.launch.device_ordinal = 0;
    for (uint64_t at : {in, out}) {
      const bool is_arg = at == in;
      static const int64_t kDims[] = {256};
      Buf buf;
      buf.is_arg = is_arg;
      buf.dtype = XLA_FFI_DataType_F32;
      buf.rank = 1;
      buf.dims = kDims;
      const uint64_t base = is_arg && in_alloc != 0 ? in_alloc : alloc;
      buf.data = reinterpret_cast<void*>(static_cast<uintptr_t>(base + at));
      buf.bytes = 1024;
      ClientStatus id =
          cuda_client::IdentifyBuffer(call.d, buf.data, &buf.id, &buf.offset);
      INFO(id.message);
      REQUIRE(id.ok());
      call.bufs.push_back(buf);
    }
    return LaunchOnConn(conn.get(), &call, &req, &resp);
  }
  // Stream memory operations the client enqueued on XLA's stream since the
  // last look: "ready N" (write) and "wait N" (wait on done).
  std::vector<std::string> Memops() {
    std::vector<std::string> out;
    for (size_t i = seen_memops; i < fake.memops.size(); ++i) {
      const FakeCuda::MemOp& m = fake.memops[i];
      out.push_back((m.write ? "ready " : "wait ") + std::to_string(m.value));
    }
    seen_memops = fake.memops.size();
    return out;
  }
  FakeCuda fake;
  std::unique_ptr<Conn> conn;
  uint64_t alloc = 0;
  kreg::v1::SessionRequest req;
  kreg::v1::SessionResponse resp;
  size_t seen_memops = 0;
  // The launch's attribute bytes (an AttributeBlock): scale=2.5.
  std::string attrs = [] {
    kreg::v1::AttributeBlock l;
    kreg::v1::Attribute* a = l.add_attrs();
    a->set_name("scale");
    a->set_kind(kreg::v1::ATTR_KIND_SCALAR);
    a->set_dtype(XLA_FFI_DataType_F32);
    const float v = 2.5f;
    a->set_data(&v, sizeof(v));
    return l.SerializeAsString();
  }();
};

TEST_CASE(
    "Steady-state CUDA calls go on the ring; the first shares on the "
    "socket",
    "[shim][cuda][ring]") {
  FakeKregd kregd;
  Client client(&kregd, /*async=*/false);
  REQUIRE(client.Launch("t.scale").ok());
  CHECK(kregd.socket_count() == 1);
  CHECK(kregd.ring_count() == 0);
  {
    std::lock_guard<std::mutex> l(kregd.mu);
    const SocketSeen& first = kregd.socket_launches[0];
    CHECK(first.launch.shares_size() == 1);  // the allocation, with its fd
    CHECK(first.desc.doorbell_seq == 1);
    // The socket Launch carries the described descriptor: shapes, refs,
    // attributes (flags 0).
    CHECK(first.desc.target == "t.scale");
    CHECK(first.desc.platform == "cuda");
    CHECK(first.desc.device_uuid == kregd.uuid);
    CHECK(first.desc.flags == 0);
    CHECK(first.desc.run_id == 77);
    REQUIRE(first.desc.dtypes.size() == 2);
    CHECK(first.desc.dtypes[0] == XLA_FFI_DataType_F32);
    CHECK(first.desc.dims[0] == std::vector<int64_t>{256});
    CHECK(first.desc.offsets[0] == 0);
    CHECK(first.desc.offsets[1] == 4096);
    CHECK(first.desc.refs[0].base == client.alloc);
    CHECK(first.desc.refs[1].size == 1 << 20);
    CHECK(first.desc.attrs == client.attrs);
  }
  CHECK(client.Memops() == std::vector<std::string>{"ready 1", "wait 1"});
  for (int i = 0; i < 6; ++i) {
    ClientStatus s = client.Launch("t.scale");
    INFO(s.message);
    REQUIRE(s.ok());
  }
  CHECK(kregd.socket_count() == 1);
  REQUIRE(kregd.ring_count() == 6);
  {
    std::lock_guard<std::mutex> l(kregd.mu);
    const RingSeen& r = kregd.ring_launches.back();
    CHECK(r.target == "t.scale");
    CHECK(r.platform == "cuda");
    CHECK(r.device_uuid == kregd.uuid);
    CHECK(r.doorbell_seq == 7);
    CHECK(r.flags == 0);
    REQUIRE(r.refs.size() == 2);
    CHECK(r.refs[0].base == client.alloc);
    CHECK(r.refs[0].size == 1 << 20);
    CHECK(r.refs[0].generation != 0);
    CHECK(r.offsets == std::vector<uint64_t>{0, 4096});
    CHECK(r.dims == std::vector<std::vector<int64_t>>{{256}, {256}});
    CHECK(r.dtypes ==
          std::vector<int32_t>{XLA_FFI_DataType_F32, XLA_FFI_DataType_F32});
    CHECK(r.attrs == client.attrs);
    CHECK(r.run_id == 77);
  }
  std::vector<std::string> ops = client.Memops();
  REQUIRE(ops.size() == 12);
  CHECK(ops[10] == "ready 7");
  CHECK(ops[11] == "wait 7");

  // An error from the ring is this call's; done not signalled: no wait.
  kregd.SetOnRing(
      [](const RingSeen&, int* code, std::string* message, uint32_t* flags) {
        *code = 3;
        *message = "t.scale: refused";
        *flags = 0;
      });
  ClientStatus s = client.Launch("t.scale");
  CHECK(s.code == 3);
  CHECK(s.message == "t.scale: refused");
  CHECK(client.Memops() == std::vector<std::string>{"ready 8"});

  // kregd no longer holds the allocation: shared again on the socket.
  kregd.SetOnRing(
      [](const RingSeen&, int* code, std::string* message, uint32_t* flags) {
        *code = 5;
        *message = "arg 0: allocation ... is not shared";
        *flags = ring::kDoneSignalled | ring::kMappingMissing;
      });
  s = client.Launch("t.scale");
  INFO(s.message);
  CHECK(s.ok());
  CHECK(kregd.socket_count() == 2);
  {
    std::lock_guard<std::mutex> l(kregd.mu);
    CHECK(kregd.socket_launches[1].launch.shares_size() == 1);
    CHECK(kregd.socket_launches[1].desc.doorbell_seq == 10);
  }
  CHECK(client.Memops() ==
        std::vector<std::string>{"ready 9", "wait 9", "ready 10", "wait 10"});
}

TEST_CASE(
    "Asynchronous ring launches: no wait for kregd, errors on the next "
    "call",
    "[shim][cuda][ring]") {
  FakeKregd kregd;
  kregd.SetRingDelay(std::chrono::milliseconds(30));
  Client client(&kregd, /*async=*/true);
  REQUIRE(client.Launch("t.scale").ok());  // shares: the socket
  CHECK(kregd.socket_count() == 1);
  client.Memops();
  // Returns before the completion (delayed 30 ms), with XLA's stream told
  // to wait for done.
  REQUIRE(client.Launch("t.scale").ok());
  CHECK(client.conn->async_in_flight() == 1);
  CHECK(client.Memops() == std::vector<std::string>{"ready 2", "wait 2"});
  {
    std::lock_guard<std::mutex> l(kregd.mu);
    REQUIRE(kregd.ring_launches.size() <= 1);
  }
  // A failing handler: its call returns OK; the next call reports it,
  // naming the target, and is not run.
  kregd.SetOnRing(
      [](const RingSeen& r, int* code, std::string* message, uint32_t*) {
        if (r.target == "t.fail") {
          *code = 3;
          *message = "t.fail: refused on purpose";
        }
      });
  REQUIRE(client.Launch("t.fail").ok());
  CHECK(client.Memops() == std::vector<std::string>{"ready 3", "wait 3"});
  ClientStatus s = client.Launch("t.scale");
  CHECK(s.code == 3);
  CHECK(s.message ==
        "kreg: an earlier asynchronous launch of \"t.fail\" failed "
        "(KREG_ASYNC_LAUNCH=1 reports it on the session's next call; that "
        "call was not run): t.fail: refused on purpose");
  CHECK(client.Memops().empty());  // not run
  CHECK(kregd.ring_count() == 2);
  {
    std::lock_guard<std::mutex> l(kregd.mu);
    CHECK(kregd.ring_launches[1].flags == ring::kSubmitAsync);
  }
  // Reported once: the session goes on.
  REQUIRE(client.Launch("t.scale").ok());
  CHECK(client.Memops() == std::vector<std::string>{"ready 4", "wait 4"});

  // A new allocation goes on the socket, after the ring launch in flight
  // has completed (never overtaking it).
  const uint64_t other =
      client.fake.ClientAllocation(FakeCuda::Kind::kVmmPosixFd, 1 << 20);
  client.alloc = other;
  REQUIRE(client.Launch("t.scale").ok());
  CHECK(client.conn->async_in_flight() == 0);
  std::lock_guard<std::mutex> l(kregd.mu);
  CHECK(kregd.order == std::vector<std::string>{"socket 1", "ring 2", "ring 3",
                                                "ring 4", "socket 5"});
}

TEST_CASE(
    "A call whose only new buffer is staged (a pool allocation) goes on the "
    "ring",
    "[shim][cuda][ring]") {
  FakeKregd kregd;
  Client client(&kregd, /*async=*/false);
  // The output's allocation and the staging buffer are shared by the first
  // calls; after that, each call's input is a fresh stream-ordered pool
  // allocation (as with XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async): staged,
  // nothing for kregd to map, so the launch needs no socket.
  for (int i = 0; i < 4; ++i) {
    const uint64_t pool =
        client.fake.ClientAllocation(FakeCuda::Kind::kPool, 4096);
    ClientStatus s = client.Launch("t.scale", 0, 4096, pool);
    INFO(i << ": " << s.message);
    REQUIRE(s.ok());
  }
  CHECK(kregd.socket_count() == 1);
  CHECK(kregd.ring_count() == 3);
}

TEST_CASE("KREG_ASYNC_LAUNCH: 1 only under MPS, force always, else off",
          "[shim][cuda][ring]") {
  MpsControl live;
  live.live = true;
  live.detail = "MPS control daemon at /run/nvidia-mps/control";
  MpsControl none;
  none.detail = "no MPS control daemon: /tmp/nvidia-mps/control does not exist";
  std::string warning = "stale";
  CHECK_FALSE(ChooseAsyncLaunch(nullptr, none, &warning));
  CHECK(warning.empty());
  CHECK_FALSE(ChooseAsyncLaunch("0", live, &warning));
  CHECK_FALSE(ChooseAsyncLaunch("yes", live, &warning));
  CHECK(warning.empty());
  CHECK(ChooseAsyncLaunch("force", none, &warning));
  CHECK(warning.empty());
  CHECK(ChooseAsyncLaunch("1", live, &warning));
  CHECK(warning.empty());
  CHECK_FALSE(ChooseAsyncLaunch("1", none, &warning));
  CHECK_THAT(warning,
             Catch::Contains("KREG_ASYNC_LAUNCH=1 ignored: CUDA launches stay "
                             "synchronous because the GPU is time-sliced (no "
                             "MPS control daemon: /tmp/nvidia-mps/control "
                             "does not exist)"));
  CHECK_THAT(warning, Catch::Contains("set KREG_ASYNC_LAUNCH=force"));
}

TEST_CASE("KREG_ASYNC_LAUNCH=1 without MPS: the launch stays synchronous",
          "[shim][cuda][ring]") {
  char dir[] = "/tmp/kreg-nomps-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", dir, 1);
  FakeKregd kregd;
  Client client(&kregd, /*async=*/true, "1");
  ClientStatus s = client.Launch("t.scale");  // shares: socket
  INFO(s.message);
  REQUIRE(s.ok());
  s = client.Launch("t.scale");  // steady state: ring, awaited
  INFO(s.message);
  CHECK(s.ok());
  CHECK(client.conn->async_in_flight() == 0);
  ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  ::rmdir(dir);
}

}  // namespace
}  // namespace kreg::shim
