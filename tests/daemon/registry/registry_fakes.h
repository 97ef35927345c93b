// Fakes of the registry's borrowed interfaces, for unit tests.
#ifndef KREGD_TESTS_DAEMON_REGISTRY_REGISTRY_FAKES_H_
#define KREGD_TESTS_DAEMON_REGISTRY_REGISTRY_FAKES_H_

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/registry/registrar.h"
#include "daemon/registry/registration_service.h"
#include "daemon/registry/repointer.h"
#include "daemon/store/module_store.h"

namespace kreg {

// In-memory HandlerLoader that counts loads and tracks what is in the
// "store": staged temp files, committed files, discarded ones. Thread-safe
// (the registry calls it outside its lock). A probe of func "Slow" blocks
// until OpenGate() (or 20 s, the real probe's limit). Every handler is FFI
// API 0.4 with traits 0, except "Traits1" (traits 1) and "Minor5" (0.5).
class FakeLoader : public HandlerLoader {
 public:
  absl::StatusOr<StagedModule> Stage(const std::string& bytes,
                                     const std::string& digest) override {
    if (digest != Sha256Digest(bytes)) {
      return absl::InternalError("digest does not match the bytes");
    }
    absl::MutexLock lock(&mu);
    stored.push_back(digest);
    bool fresh = files.count(digest) == 0;
    if (fresh) temps.insert(digest);
    return StagedModule{digest, fresh ? "tmp/" + digest : digest, fresh};
  }
  absl::StatusOr<HandlerInfo> Probe(const StagedModule&,
                                    const std::string& func) override {
    if (func == "NotAHandler") {
      return absl::InvalidArgumentError("NotAHandler is not a handler");
    }
    if (func == "Slow") {
      absl::MutexLock lock(&mu);
      ++slow_probes;
      mu.AwaitWithTimeout(absl::Condition(&gate_open), absl::Seconds(20));
    }
    if (func == "Traits1") return HandlerInfo{0, 4, 1, 0};
    if (func == "Minor5") return HandlerInfo{0, 5, 0, 0};
    return HandlerInfo{0, 4, 0, 0};
  }
  absl::Status Commit(const StagedModule& staged) override {
    if (!staged.fresh) return absl::OkStatus();
    absl::MutexLock lock(&mu);
    if (temps.erase(staged.digest) == 0) {
      return absl::InternalError("the staged temp file is gone");
    }
    files.insert(staged.digest);
    return absl::OkStatus();
  }
  void Discard(const StagedModule& staged) override {
    if (!staged.fresh) return;
    absl::MutexLock lock(&mu);
    temps.erase(staged.digest);
    discarded.push_back(staged.digest);
  }
  absl::Status Check(const std::string&) override {
    loads.fetch_add(1);
    return absl::OkStatus();
  }
  absl::Status CheckStored(const std::string& d) override {
    if (!stored_ok) return absl::DataLossError("store file is corrupt");
    return Check(d);
  }
  absl::StatusOr<GcOutcome> RemoveUnreferenced(
      const std::set<std::string>& keep) override {
    absl::MutexLock lock(&mu);
    gc_keep = keep;
    ++sweeps;
    temps.clear();  // like the store: leftover temp files go too
    GcOutcome out;
    for (auto it = files.begin(); it != files.end();) {
      if (keep.count(*it) != 0) {
        ++out.files_kept;
        ++it;
      } else {
        ++out.files_removed;
        it = files.erase(it);
      }
    }
    return out;
  }
  void OpenGate() {
    absl::MutexLock lock(&mu);
    gate_open = true;
  }
  // Waits until `n` probes of "Slow" are blocked at the gate.
  void AwaitSlowProbes(int n) {
    absl::MutexLock lock(&mu);
    auto reached = [&] { return slow_probes >= n; };
    mu.Await(absl::Condition(&reached));
  }
  absl::Mutex mu;
  std::vector<std::string> stored;  // every Stage call
  std::set<std::string> temps, files, gc_keep;
  std::vector<std::string> discarded;
  std::atomic<int> loads{0};
  int sweeps = 0;
  bool stored_ok = true;

 private:
  bool gate_open = false;
  int slow_probes = 0;
};

class MemLog : public RegistrationLog {
 public:
  absl::Status Append(const TargetEntry& e) override {
    if (fail) return absl::InternalError("disk full");
    absl::MutexLock lock(&mu);
    entries.push_back(e);
    return absl::OkStatus();
  }
  absl::Status AppendRetirement(const Retirement& r) override {
    if (fail) return absl::InternalError("disk full");
    absl::MutexLock lock(&mu);
    retirements.push_back(r);
    return absl::OkStatus();
  }
  absl::Status AppendReservation(const NameReservation& r,
                                 bool lifted) override {
    if (fail) return absl::InternalError("disk full");
    absl::MutexLock lock(&mu);
    reservations.push_back({r, lifted});
    return absl::OkStatus();
  }
  absl::Mutex mu;
  std::vector<std::pair<NameReservation, bool>> reservations;
  std::vector<TargetEntry> entries;
  std::vector<Retirement> retirements;
  bool fail = false;
};

// A fake oracle: `bound` maps a target name to the pids that bind it (as
// uid 1000 + pid).
class FakeOracle : public BindingOracle {
 public:
  std::vector<PeerCred> Holders(const TargetKey& key) override {
    std::vector<PeerCred> out;
    auto it = bound.find(key.name);
    if (it == bound.end()) return out;
    for (pid_t pid : it->second) {
      out.push_back({static_cast<uid_t>(1000 + pid), 0, pid});
    }
    return out;
  }
  std::vector<GenerationHold> GenerationHolds(const TargetKey& key) override {
    auto it = holds.find(key.name);
    return it == holds.end() ? std::vector<GenerationHold>{} : it->second;
  }
  std::map<std::string, std::vector<pid_t>> bound;
  // What GenerationHolds answers, by target name.
  std::map<std::string, std::vector<GenerationHold>> holds;
};

// Records what the registry asked; answers `laggards`. `during` runs once,
// inside the first Repoint.
struct FakeRepointer : Repointer {
  std::vector<std::pair<std::string, uint64_t>> calls;
  absl::Duration budget;
  std::vector<Laggard> laggards;
  std::function<void()> during;
  std::vector<Laggard> Repoint(const TargetEntry& e,
                               absl::Time deadline) override {
    calls.emplace_back(e.key.name, e.generation);
    budget = deadline - absl::Now();
    if (during) {
      std::function<void()> f = std::move(during);
      during = nullptr;
      f();
    }
    return laggards;
  }
};

inline RegisterArgs Args(const std::string& name, const std::string& bytes,
                         const std::string& func = "Scale",
                         Platform platform = Platform::kCpu) {
  RegisterArgs a;
  a.key = {name, platform};
  a.func_name = func;
  a.module_bytes = bytes;
  a.origin = "upload";
  return a;
}

// Args registered by `uid` (pid 100 + uid).
inline RegisterArgs ArgsBy(uid_t uid, const std::string& name,
                           const std::string& bytes) {
  RegisterArgs a = Args(name, bytes);
  a.peer = {uid, uid, static_cast<pid_t>(100 + uid)};
  return a;
}

// An in-process registration by uid 0 (cuda, pid 7).
inline RegisterArgs InProcessArgs(const std::string& name,
                                  const std::string& cid) {
  RegisterArgs a;
  a.key = {name, Platform::kCuda};
  a.func_name = "my_kernel";
  a.content_id = cid;
  a.kind = TargetKind::kInProcess;
  a.origin = "in-process:pid 7";
  a.peer = {0, 0, 7};
  return a;
}

// A registry and a registrar over the fakes, taking modules of at most
// `max_module` bytes from under `root` (the broker's tests and fuzzer).
struct RegistrarWorld {
  RegistrarWorld(const std::string& root, uint64_t max_module)
      : registry(&loader, &log),
        registrar(&registry, ModulePolicy{{root}, max_module, ""}) {}
  FakeLoader loader;
  MemLog log;
  Registry registry;
  Registrar registrar;
};

}  // namespace kreg

#endif  // KREGD_TESTS_DAEMON_REGISTRY_REGISTRY_FAKES_H_
