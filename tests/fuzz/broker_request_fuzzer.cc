// Fuzzes what kregd does with a BrokerRequest from an executor (broker.cc):
// the parse, then for each body what SessionBroker::Handle runs before it
// needs a live executor: RegisterFromHeader (registration_mapper.h) through
// a real Registrar and Registry (in-memory loader and log; daemon-side
// paths under a temp root), DescribeTargets, and Resolve's name/platform
// validation and lookup.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>

#include "daemon/base/validate.h"
#include "daemon/registry/registrar.h"
#include "daemon/registry/registration_mapper.h"
#include "daemon/supervisor/broker.h"
#include "tests/daemon/registry/registry_fakes.h"
#include "tests/fuzz/fuzz_util.h"

namespace kreg {
namespace {

// The daemon's state; recreated when it has grown, so memory stays flat.
struct World {
  World(const std::string& root)
      : registry(&loader, &log),
        registrar(&registry, ModulePolicy{{root}, 1 << 20, ""}) {}
  FakeLoader loader;
  MemLog log;
  Registry registry;
  Registrar registrar;
};

std::string* Root() {
  static std::string* root = [] {
    auto* r = new std::string(fuzz::MakeTempDir("broker-fuzz"));
    std::ofstream(*r + "/libk.so") << "not really an ELF";
    std::ofstream(*r + "/empty.so");
    ::mkdir((*r + "/sub").c_str(), 0755);
    ::symlink("../libk.so", (*r + "/sub/up.so").c_str());
    ::symlink("/etc/passwd", (*r + "/out.so").c_str());
    return r;
  }();
  return root;
}

std::unique_ptr<World>& TheWorld() {
  static std::unique_ptr<World> world;
  if (world == nullptr || world->registry.List().size() > 64) {
    world = std::make_unique<World>(*Root());
  }
  return world;
}

}  // namespace
}  // namespace kreg

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kreg::fuzz::QuietLogs();
  kreg::Root();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kreg;
  v1::BrokerRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  World& w = *TheWorld();
  const PeerCred peer{::getuid(), ::getgid(), ::getpid()};
  switch (req.body_case()) {
    case v1::BrokerRequest::kRegisterTarget: {
      absl::StatusOr<v1::RegisterTargetResponse> r = RegisterFromHeader(
          &w.registrar, req.register_target(), "", peer, absl::OkStatus());
      if (r.ok()) {
        // What was accepted must pass the edge checks it went through.
        if (!ValidateTargetName(r->target().target_name()).ok() ||
            !ParsePlatform(r->target().platform()).ok()) {
          fuzz::Fail("accepted a registration that fails validation");
        }
      } else if (r.status().message().empty()) {
        fuzz::Fail("refusal without a message");
      }
      break;
    }
    case v1::BrokerRequest::kList:
      DescribeTargets(w.registry, absl::OkStatus());
      break;
    case v1::BrokerRequest::kResolve: {
      const v1::ResolveRequest& r = req.resolve();
      if (!ValidateTargetName(r.target_name()).ok()) break;
      absl::StatusOr<Platform> platform = ParsePlatform(r.platform());
      if (!platform.ok()) break;
      EntryPtr e = w.registry.Lookup(TargetKey{r.target_name(), *platform});
      if (e != nullptr && e->key.name != r.target_name()) {
        fuzz::Fail("lookup returned another target");
      }
      break;
    }
    default:
      break;
  }
  return 0;
}
