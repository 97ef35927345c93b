// Fuzzes what kregd reads from a control connection (broker.cc): the bytes
// a client writes into the session socket after a first request that is
// not Hello, framed with wire::RecvFrame at kMaxControlRequestBytes, each
// frame parsed as a SessionRequest and answered by HandleControl with a
// module memfd the first byte chooses, through a real Registrar and
// Registry. Invariants: no frame is buffered past the cap (whatever length
// it announces); a registration succeeds with an upload only from a memfd
// sealed against writing, shrinking and growing whose size is the announced
// one (module.upload_size), never with a stray fd; every refusal has a
// message; only RegisterTarget, List, a control_hello of kregd's
// protocol major and (with re-pointing) a watch without descriptors keep
// the connection open. After an accepted watch the frames go to
// ReadRepointAck and LocalRepointer::Acked (docs/replace.md section 4):
// only a repoint_ack without descriptors is taken.
//
// Input: byte 0 = how a registration's module fd is made (mod 5): 0 none,
// 1 a sealed memfd of the announced size, 2 the same unsealed, 3 sealed but
// one byte longer, 4 a pipe (also attached to every other frame); byte 0 /
// 5 odd: kregd re-points local binds (replace = "owner"), else watch is
// refused; the rest is the byte stream.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/wire.h"
#include "daemon/api/control_requests.h"
#include "daemon/base/module_upload.h"
#include "daemon/base/protocol_version.h"
#include "daemon/registry/registrar.h"
#include "daemon/registry/registration_mapper.h"
#include "daemon/supervisor/local_repointer.h"
#include "daemon/supervisor/session_bindings.h"
#include "tests/daemon/registry/registry_fakes.h"
#include "tests/fuzz/fuzz_util.h"

namespace kreg {
namespace {

constexpr uint64_t kMaxModule = 1 << 20;

// The daemon's state; recreated when it has grown, so memory stays flat.
struct World : RegistrarWorld {
  explicit World(const std::string& root) : RegistrarWorld(root, kMaxModule) {}
  SessionBindings bindings;
  LocalRepointer repointer{&bindings, nullptr};
};

World& TheWorld() {
  static std::string* root = new std::string(fuzz::MakeTempDir("frames"));
  static std::unique_ptr<World> world;
  if (world == nullptr || world->registry.List().size() > 64) {
    world = std::make_unique<World>(*root);
  }
  return *world;
}

enum FdKind { kNone, kSealed, kUnsealed, kLonger, kPipe, kKinds };

// The module fd of `kind` for an upload of `size` bytes: the memfd holds
// `bytes` (repeated), at most kMaxModule + 1 bytes of it.
UniqueFd ModuleFd(int kind, uint64_t size, const std::string& bytes) {
  if (kind == kPipe) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) fuzz::Fail("pipe");
    ::close(p[1]);
    return UniqueFd(p[0]);
  }
  UniqueFd fd(::memfd_create("fuzz-module", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  uint64_t n =
      std::min<uint64_t>(size + (kind == kLonger ? 1 : 0), kMaxModule + 1);
  std::string content(n, '\0');
  for (uint64_t i = 0; i < n && !bytes.empty(); ++i) {
    content[i] = bytes[i % bytes.size()];
  }
  if (!fd.ok() || ::write(fd.get(), content.data(), content.size()) !=
                      static_cast<ssize_t>(content.size())) {
    fuzz::Fail("memfd");
  }
  if (kind != kUnsealed && ::fcntl(fd.get(), F_ADD_SEALS, kModuleSeals) != 0) {
    fuzz::Fail("seal");
  }
  return fd;
}

enum Next { kClose, kControl, kWatch };

// One frame of a watch connection; false when it closes the connection.
bool OneAck(int kind, const std::string& payload) {
  absl::StatusOr<v1::RepointAck> ack =
      ReadRepointAck(payload, kind != kNone ? 1 : 0);
  v1::SessionRequest req;
  const bool is_ack = req.ParseFromString(payload) && req.has_repoint_ack();
  if (ack.ok() != (is_ack && kind == kNone)) {
    fuzz::Fail("took a watch frame that is no repoint_ack, or refused one");
  }
  if (!ack.ok()) {
    if (ack.status().message().empty()) fuzz::Fail("refusal without text");
    return false;
  }
  TheWorld().repointer.Acked(1, *ack);
  return true;
}

// One request of a control connection.
Next OneFrame(int kind, bool owner, const std::string& payload) {
  v1::SessionRequest req;
  if (!req.ParseFromString(payload)) return kClose;
  const v1::RegisterTargetHeader& reg = req.register_target();
  const uint64_t size = reg.module().upload_size();
  const bool by_fd =
      reg.module().source_case() == v1::ModuleSource::kUploadSize;
  std::vector<UniqueFd> fds;
  if (kind != kNone) fds.push_back(ModuleFd(kind, size, payload));
  World& w = TheWorld();
  const PeerCred peer{::getuid(), ::getgid(), ::getpid()};
  UidLimits limits{};
  limits[static_cast<size_t>(UidResource::kUploadBytes)] = 2 * kMaxModule;
  UidAccount account(limits);
  BrokerContext ctx;
  ctx.registrar = &w.registrar;
  ctx.registry = &w.registry;
  ctx.max_module_bytes = kMaxModule;
  ctx.account = &account;
  if (owner) ctx.local_repointer = &w.repointer;
  bool close = false;
  v1::SessionResponse resp =
      HandleControl(ctx, 1, peer, req, std::move(fds), &close);
  const bool watch = req.has_watch() && owner && kind == kNone;
  const bool control =
      req.has_register_target() || req.has_list() || watch ||
      (req.has_control_hello() &&
       req.control_hello().protocol_major() == kSessionProtocolMajor);
  if (close == control) fuzz::Fail("closed a control request, or kept another");
  if (resp.id() != req.id()) fuzz::Fail("answered another request id");
  if (resp.has_watch() != watch) fuzz::Fail("a watch was (not) accepted");
  if (resp.status().code() != 0) {
    if (resp.status().message().empty()) fuzz::Fail("refusal without text");
    return close ? kClose : kControl;
  }
  if (watch) return kWatch;
  if (account.Held(peer.uid, UidResource::kUploadBytes) != 0) {
    fuzz::Fail("an upload's bytes stayed held");
  }
  if (req.has_register_target()) {
    if (by_fd && kind != kSealed) {
      fuzz::Fail("took a module fd that is not sealed");
    }
    if (by_fd && resp.register_target().target().module_size() != size) {
      fuzz::Fail("took a module of another size than announced");
    }
    if (!by_fd && kind != kNone) {
      fuzz::Fail("took a registration with a stray fd");
    }
  }
  return kControl;
}

}  // namespace
}  // namespace kreg

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kreg::fuzz::QuietLogs();
  kreg::TheWorld();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kreg;
  // What fits a Unix socket's buffer at once (written before it is read).
  if (size < 1 || size > (64u << 10) + 1) return 0;
  const int kind = data[0] % kKinds;
  const bool owner = (data[0] / kKinds) % 2 == 1;
  UniqueFd kregd = fuzz::ClosedStream(data + 1, size - 1);
  if (!kregd.ok()) fuzz::Fail("socketpair");
  std::string payload;
  Next next = kControl;
  for (;;) {
    std::vector<int> raw;
    int rc =
        wire::RecvFrame(kregd.get(), kMaxControlRequestBytes, &payload, &raw);
    for (int fd : raw) ::close(fd);
    // Nothing is sized by the announced length: at most the cap arrives,
    // and the buffer grows with the bytes that did.
    if (payload.size() > kMaxControlRequestBytes ||
        payload.capacity() > 2 * size_t{kMaxControlRequestBytes}) {
      fuzz::Fail("a control frame was buffered past the cap");
    }
    // kregd ends the connection on a bad frame or a refused request.
    if (rc != wire::kOk) break;
    if (next == kWatch) {
      if (!OneAck(kind, payload)) break;
    } else {
      next = OneFrame(kind, owner, payload);
      if (next == kClose) break;
    }
  }
  TheWorld().repointer.Detach(1);
  return 0;
}
