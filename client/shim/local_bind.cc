#include "client/shim/local_bind.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <condition_variable>
#include <map>
#include <mutex>
#include <utility>

#include "client/shim/forward.h"
#include "client/shim/repoint_watch.h"
#include "common/sha256.h"

namespace kreg {
namespace shim {
namespace {

// What kregd seals a module memfd with (daemon/store/module_store.h
// kLocalModuleSeals).
constexpr int kRequiredSeals =
    F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

std::string Describe(const v1::Target& t) {
  return "\"" + t.target_name() + "\" (" + t.platform() + ")";
}

std::mutex g_mu;
// Module digest -> dlopen handle (never closed: XLA keeps the handler).
std::map<std::string, void*>* g_modules = new std::map<std::string, void*>();
// (target, canonical platform) -> its local binding.
std::map<std::pair<std::string, std::string>, LocalBinding>* g_bound =
    new std::map<std::pair<std::string, std::string>, LocalBinding>();
// (target, canonical platform) -> its binds in progress: a notice for it
// waits for them (kregd may send it before BindLocal recorded the binding).
std::map<std::pair<std::string, std::string>, int>* g_binding =
    new std::map<std::pair<std::string, std::string>, int>();
std::condition_variable g_bound_cv;  // a bind ended
// A forked child runs none of its parent's binds in progress.
[[maybe_unused]] const int g_binding_atfork =
    ::pthread_atfork(nullptr, nullptr, [] { g_binding->clear(); });

// True when `addr` lies in a mapping of the file (dev, ino) of this
// process (/proc/self/maps).
bool MappedFrom(const void* addr, dev_t dev, ino_t ino) {
  FILE* f = fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  char line[4096];
  bool found = false;
  while (fgets(line, sizeof(line), f) != nullptr) {
    uintptr_t lo = 0, hi = 0;
    unsigned int maj = 0, min = 0;
    unsigned long long inode = 0;  // NOLINT(runtime/int): sscanf's type
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %x:%x %llu", &lo, &hi,
               &maj, &min, &inode) != 5) {
      continue;
    }
    if (a < lo || a >= hi) continue;
    found = maj == major(dev) && min == minor(dev) &&
            static_cast<ino_t>(inode) == ino;
    break;
  }
  fclose(f);
  return found;
}

ClientStatus NamedSymbol(void* dl, const v1::Target& target,
                         const std::string& name, void** out) {
  ::dlerror();
  *out = ::dlsym(dl, name.c_str());
  if (*out != nullptr) return ClientStatus::Ok();
  return ClientStatus::Error(
      kNotFound, "kreg: module " + target.module_digest() + " of " +
                     Describe(target) + " has no symbol \"" + name + "\"");
}

// The bundle target.func_name() names (common/handler_spec.h).
ClientStatus SpecOf(const v1::Target& target, HandlerSpec* spec) {
  std::string error;
  if (ParseHandlerSpec(target.func_name(), spec, &error)) {
    return ClientStatus::Ok();
  }
  return ClientStatus::Error(
      kInvalidArgument,
      "kreg: the function of " + Describe(target) + " is malformed: " + error);
}

// The execute handler of target.func_name() in the loaded module `dl`.
ClientStatus Symbol(void* dl, const v1::Target& target, void** out) {
  HandlerSpec spec;
  ClientStatus s = SpecOf(target, &spec);
  if (!s.ok()) return s;
  return NamedSymbol(dl, target, spec.execute(), out);
}

// Every stage's handler and the state type of a bundle (LocalBinding).
ClientStatus BundleOf(void* dl, const v1::Target& target, LocalBinding* b) {
  HandlerSpec spec;
  ClientStatus s = SpecOf(target, &spec);
  for (int i = 0; s.ok() && i < kNumHandlerStages; ++i) {
    if (!spec.stages[i].empty()) {
      s = NamedSymbol(dl, target, spec.stages[i], &b->stages[i]);
    }
  }
  if (s.ok() && !spec.state_type.empty()) {
    s = NamedSymbol(dl, target, spec.state_type.id_symbol, &b->state_type_id);
    if (s.ok()) {
      s = NamedSymbol(dl, target, spec.state_type.info_symbol,
                      &b->state_type_info);
    }
    // Once per binding, kept for the process's life (the C ABI hands it
    // out).
    if (s.ok()) b->state_type_name = strdup(spec.state_type.name.c_str());
  }
  return s;
}

// The handler of `info`: its symbol in the loaded module of its digest, or
// in `module`, loaded now. g_mu held.
ClientStatus HandlerOf(UniqueFd module, const v1::Target& info,
                       void** handler) {
  auto loaded = g_modules->find(info.module_digest());
  if (loaded != g_modules->end()) {
    // One copy per module, as in-process: targets of one library share
    // its globals.
    return Symbol(loaded->second, info, handler);
  }
  void* library = nullptr;
  ClientStatus s = LoadModule(std::move(module), info, handler, &library);
  if (s.ok()) (*g_modules)[info.module_digest()] = library;
  return s;
}

}  // namespace

ClientStatus CheckModuleFd(int fd, const v1::Target& target) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return ClientStatus::Error(
        kFailedPrecondition,
        "kreg: kregd handed out something that is not a module file for " +
            Describe(target) + "; nothing was loaded");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kRequiredSeals) != kRequiredSeals) {
    return ClientStatus::Error(
        kFailedPrecondition,
        "kreg: the module kregd handed out for " + Describe(target) +
            " is not sealed against changes (seals " + std::to_string(seals) +
            "), so it could change after the check; nothing was loaded");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size != target.module_size() || size == 0) {
    return ClientStatus::Error(
        kDataLoss,
        "kreg: the module kregd handed out for " + Describe(target) + " has " +
            std::to_string(size) + " bytes, not the registered " +
            std::to_string(target.module_size()) + "; nothing was loaded");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    return ClientStatus::Error(kInternal, "kreg: cannot map the module of " +
                                              Describe(target) + ": " +
                                              strerror(errno));
  }
  const std::string digest = Sha256Hex(map, size);
  ::munmap(map, size);
  if (digest != target.module_digest()) {
    return ClientStatus::Error(
        kDataLoss, "kreg: the module kregd handed out for " + Describe(target) +
                       " has digest " + digest + ", not the registered " +
                       target.module_digest() +
                       "; it was not loaded. kregd's store copy may be "
                       "corrupt: see `kregctl show " +
                       target.target_name() + "` and kregd's log");
  }
  return ClientStatus::Ok();
}

ClientStatus LoadModule(UniqueFd fd, const v1::Target& target, void** handler,
                        void** library) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return ClientStatus::Error(kInternal,
                               std::string("kreg: fstat: ") + strerror(errno));
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd.get());
  // RTLD_LOCAL: its symbols cannot clash with jaxlib's or other modules';
  // RTLD_NODELETE: pinned for the process's life (XLA keeps the handler).
  void* dl = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (dl == nullptr) {
    const char* why = ::dlerror();
    return ClientStatus::Error(
        kInternal, "kreg: cannot load the module of " + Describe(target) +
                       " (" + target.module_digest() +
                       ") into this process: " + (why ? why : "dlopen failed") +
                       ". Run it isolated (execution=\"isolated\") instead");
  }
  // Kept open from here on, whatever follows: the library stays loaded
  // (RTLD_NODELETE), so its /proc/self/fd path must never name another
  // file.
  (void)fd.release();
  void* sym;
  ClientStatus s = Symbol(dl, target, &sym);
  if (!s.ok()) return s;
  // dlopen matches already loaded objects by name first: a path reused by
  // an earlier, closed fd would hand back that object. The symbol must lie
  // in this very file.
  if (!MappedFrom(sym, st.st_dev, st.st_ino)) {
    return ClientStatus::Error(
        kInternal, "kreg: dlopen of " + path + " returned another library " +
                       "than the module of " + Describe(target) +
                       " (a library loaded earlier under the same path); "
                       "nothing was bound");
  }
  *handler = sym;
  if (library != nullptr) *library = dl;
  return ClientStatus::Ok();
}

ClientStatus BindLocal(Client* client, const std::string& target,
                       const std::string& platform, uint32_t generation,
                       LocalBinding* out) {
  const std::pair<std::string, std::string> key{target,
                                                CanonicalPlatform(platform)};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_bound->find(key);
    if (it != g_bound->end()) {
      if (it->second.pinned != generation) {
        return OtherGeneration(key.first, key.second, it->second.pinned,
                               generation);
      }
      *out = it->second;
      return ClientStatus::Ok();
    }
    ++(*g_binding)[key];
  }
  struct Done {
    const std::pair<std::string, std::string>& key;
    ~Done() {
      std::lock_guard<std::mutex> lock(g_mu);
      if (--(*g_binding)[key] == 0) g_binding->erase(key);
      g_bound_cv.notify_all();
    }
  } done{key};
  v1::BindLocalReply reply;
  UniqueFd module;
  ClientStatus s =
      client->BindLocal(target, platform, generation, &reply, &module);
  if (!s.ok()) return s;
  const v1::Target& info = reply.target();
  s = CheckModuleFd(module.get(), info);
  if (!s.ok()) return s;
  if (reply.replaceable()) {
    s = WatchRepoints(client->path(), ApplyRepoint);
    if (!s.ok()) {
      s.message = "kreg: cannot bind " + Describe(info) +
                  " locally: kregd may replace it, and watching for that "
                  "failed: " +
                  s.message;
      return s;
    }
  }
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_bound->find(key);
  if (it != g_bound->end()) {  // another thread bound it meanwhile
    if (it->second.pinned != generation) {
      return OtherGeneration(key.first, key.second, it->second.pinned,
                             generation);
    }
    *out = it->second;
    return ClientStatus::Ok();
  }
  LocalBinding binding;
  binding.target = info;
  binding.pinned = generation;
  s = HandlerOf(std::move(module), info, &binding.handler);
  if (!s.ok()) return s;
  s = BundleOf((*g_modules)[info.module_digest()], info, &binding);
  if (!s.ok()) return s;
  const bool bundle = binding.state_type_name != nullptr ||
                      binding.stages[kInstantiate] != nullptr ||
                      binding.stages[kPrepare] != nullptr ||
                      binding.stages[kInitialize] != nullptr;
  // A bundle is never re-pointed: each call site's state stays with the
  // handlers that made it (docs/replace.md, "States across a replacement").
  if (reply.replaceable() && generation == 0 && !bundle) {
    s = BindRepointable(info.target_name(), key.second, binding.handler,
                        &binding.repoint_slot, &binding.handler);
    if (!s.ok()) return s;
  }
  (*g_bound)[key] = binding;
  *out = binding;
  return ClientStatus::Ok();
}

ClientStatus ApplyRepoint(const v1::Repoint& notice, UniqueFd module,
                          uint32_t* pinned) {
  const std::pair<std::string, std::string> key{
      notice.target_name(), CanonicalPlatform(notice.platform())};
  *pinned = 0;
  {
    std::unique_lock<std::mutex> lock(g_mu);
    g_bound_cv.wait(lock, [&] { return g_binding->count(key) == 0; });
    auto it = g_bound->find(key);
    if (it != g_bound->end() && it->second.pinned != 0) {
      *pinned = it->second.pinned;
      return ClientStatus::Ok();
    }
  }
  v1::Target info;
  info.set_target_name(notice.target_name());
  info.set_platform(key.second);
  info.set_func_name(notice.func_name());
  info.set_module_digest(notice.module_digest());
  info.set_module_size(notice.module_size());
  ClientStatus s = CheckModuleFd(module.get(), info);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_bound->find(key);
  if (it == g_bound->end()) {
    return ClientStatus::Error(kNotFound,
                               "kreg: this process has no local binding of " +
                                   Describe(info) + " to move to generation " +
                                   std::to_string(notice.generation()));
  }
  LocalBinding& binding = it->second;
  if (binding.repoint_slot < 0) {
    return ClientStatus::Error(
        kFailedPrecondition,
        "kreg: this process bound " + Describe(info) +
            " locally when kregd did not replace targets, so XLA calls "
            "its handler directly; it keeps running generation " +
            std::to_string(binding.target.generation()) + " until it exits");
  }
  void* handler = nullptr;
  s = HandlerOf(std::move(module), info, &handler);
  if (!s.ok()) return s;
  SetRepointable(binding.repoint_slot, handler);
  binding.target.set_generation(notice.generation());
  binding.target.set_func_name(notice.func_name());
  binding.target.set_module_digest(notice.module_digest());
  binding.target.set_module_size(notice.module_size());
  return ClientStatus::Ok();
}

}  // namespace shim
}  // namespace kreg
