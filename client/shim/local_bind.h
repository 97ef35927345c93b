// Local execution (DESIGN §11): the registered module of a target, handed
// out by kregd as a sealed memfd, checked and loaded into this process, so
// XLA calls the genuine handler directly.
#ifndef KREGD_CLIENT_SHIM_LOCAL_BIND_H_
#define KREGD_CLIENT_SHIM_LOCAL_BIND_H_

#include <array>
#include <string>

#include "client/shim/client.h"
#include "common/handler_spec.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "kreg/v1/session.pb.h"

namespace kreg {
namespace shim {

struct LocalBinding {
  // What XLA calls (an XLA_FFI_Handler*): the registered module's handler,
  // or for a replaceable target its re-pointable entry (forward.h).
  void* handler = nullptr;
  v1::Target target;      // its registry entry (the generation it runs)
  int repoint_slot = -1;  // replaceable: its re-pointable entry's slot
  // The generation the binding pinned (docs/replace.md §7): it keeps its
  // handler when kregd re-points the key. 0: it follows the current one.
  uint32_t pinned = 0;
  // A handler bundle (docs/kernel-author-guide.md, "Handler bundles and
  // state"): every stage's genuine handler (null where it has none; for an
  // execute-only target only [kExecute]), and its state type's name
  // (static storage; null: none), XLA_FFI_TypeId* and XLA_FFI_TypeInfo* in
  // the loaded module. A bundle's binding is never re-pointable: XLA keeps
  // each call site's state with the handlers that made it.
  std::array<void*, kNumHandlerStages> stages{};
  const char* state_type_name = nullptr;
  void* state_type_id = nullptr;
  void* state_type_info = nullptr;
};

// Binds (target, platform) locally through `client`: asks kregd
// (Client::BindLocal; with `generation` > 0 for that generation, a pin),
// checks the memfd (CheckModuleFd) and loads it (LoadModule). The same
// handler for the same (target, canonical platform); FAILED_PRECONDITION
// when it is bound at another generation. Modules are loaded once per
// digest and never unloaded. When kregd says the target is replaceable, the
// process watches for Repoint notices first (WatchRepoints; its refusal is the
// bind's error) and XLA gets a re-pointable entry (BindRepointable), unless
// the bind is a pin. Thread-safe.
ClientStatus BindLocal(Client* client, const std::string& target,
                       const std::string& platform, uint32_t generation,
                       LocalBinding* out);

// Checks that `fd` is what kregd must hand out for `target`: a regular
// file of exactly target.module_size() bytes, sealed against writes,
// growth and shrinking (and further seal changes), whose SHA-256 is
// target.module_digest(). DATA_LOSS / FAILED_PRECONDITION naming the target
// and what differs.
ClientStatus CheckModuleFd(int fd, const v1::Target& target);

// dlopens a checked module fd (kept open for the life of the process, so
// its /proc/self/fd path is never reused) and resolves target.func_name();
// verifies that the symbol lies in a mapping of that very file. NOT_FOUND
// for a missing symbol, INTERNAL with dlerror() otherwise. `*library`
// (optional) gets the dlopen handle.
ClientStatus LoadModule(UniqueFd fd, const v1::Target& target, void** handler,
                        void** library = nullptr);

// Applies kregd's Repoint notice (docs/replace.md section 4) to this
// process's local binding of its (target, platform): checks `module`
// against the notice (CheckModuleFd, first), loads it (once per digest, as
// BindLocal) and moves the binding's re-pointable entry to its handler; the
// old module stays loaded. The checks' errors, NOT_FOUND when the process
// has no local binding of it, FAILED_PRECONDITION when it was bound not
// replaceable, LoadModule's errors (the binding is then unchanged). A
// binding pinned to a generation (section 7) ignores the notice: OK with
// that generation in `*pinned` (else 0). Thread-safe.
ClientStatus ApplyRepoint(const v1::Repoint& notice, UniqueFd module,
                          uint32_t* pinned);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_LOCAL_BIND_H_
