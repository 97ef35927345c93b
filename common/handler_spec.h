// A target's handler bundle (XLA FFI's XLA_FFI_Handler_Bundle, c_api.h): the
// symbol of each execution stage's handler and the state type the
// instantiate stage creates (docs/kernel-author-guide.md, "Handler bundles
// and state"). Its canonical spelling is what the registry stores as a
// target's function: a plain symbol ("Foo") for an execute-only target, as
// before bundles existed, and otherwise
//   instantiate=A;prepare=B;initialize=C;execute=D;state_type=N/I/T
// (stages in XLA's order, absent ones left out), where N is the type's
// name, I the module's data symbol of its XLA_FFI_TypeId and T that of its
// XLA_FFI_TypeInfo. One spelling per bundle, so comparing spellings
// compares bundles (idempotency and refuse-on-change, docs/design.md §2).
// libc++ only: the shim links it into JAX's process.
#ifndef KREGD_COMMON_HANDLER_SPEC_H_
#define KREGD_COMMON_HANDLER_SPEC_H_

#include <array>
#include <string>

namespace kreg {

// XLA_FFI_ExecutionStage numbering (c_api.h); RECORD is not hostable.
enum HandlerStage {
  kInstantiate = 0,
  kPrepare = 1,
  kInitialize = 2,
  kExecute = 3,
  kNumHandlerStages = 4
};

// "instantiate", "prepare", "initialize", "execute".
const char* HandlerStageName(int stage);
// The stage named `name`, or -1.
int HandlerStageOf(const std::string& name);

struct StateTypeSpec {
  std::string name;         // the name registered with XLA_FFI_Type_Register
  std::string id_symbol;    // data symbol of the module's XLA_FFI_TypeId
  std::string info_symbol;  // data symbol of its XLA_FFI_TypeInfo
  bool empty() const { return name.empty(); }
};

struct HandlerSpec {
  std::array<std::string, kNumHandlerStages> stages;  // "" where absent
  StateTypeSpec state_type;

  const std::string& execute() const { return stages[kExecute]; }
  // More than an execute handler, or a state type.
  bool IsBundle() const;
  // The canonical spelling (see the file comment).
  std::string Format() const;
  // Problems of a spec built field by field (kregctl, Python, the protocol's
  // stage list): empty when it is a valid bundle, else the message
  // (execute missing, a symbol that is not a C name, a bad state type).
  std::string Check() const;
};

// Parses a canonical or hand-written spelling (entries in any order;
// a plain symbol is an execute-only target). Returns false with `*error`
// set (naming the entry, the stage and the symbol) for an unknown stage, a
// stage given twice, a missing execute stage, a symbol that is not a C
// name or a malformed state type.
bool ParseHandlerSpec(const std::string& text, HandlerSpec* out,
                      std::string* error);

// Whether `s` is a C symbol name (1-256 characters of [A-Za-z0-9_], not
// starting with a digit).
bool IsSymbolName(const std::string& s);

}  // namespace kreg

#endif  // KREGD_COMMON_HANDLER_SPEC_H_
