// Fuzzes a target's function spelling (common/handler_spec.h), which every
// registration carries from a client: ParseHandlerSpec must accept or
// refuse any bytes with a message, and an accepted spec must check clean,
// spell itself canonically, and parse back to the same spec (one spelling
// per bundle: the registry compares spellings).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/handler_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kreg::HandlerSpec spec;
  std::string error;
  if (!kreg::ParseHandlerSpec(text, &spec, &error)) {
    if (error.empty()) std::abort();  // a refusal always says why
    return 0;
  }
  if (!error.empty() || !spec.Check().empty()) std::abort();
  const std::string canonical = spec.Format();
  kreg::HandlerSpec again;
  if (!kreg::ParseHandlerSpec(canonical, &again, &error)) std::abort();
  if (again.Format() != canonical) std::abort();
  for (int i = 0; i < kreg::kNumHandlerStages; ++i) {
    if (again.stages[i] != spec.stages[i]) std::abort();
  }
  if (again.state_type.name != spec.state_type.name ||
      again.state_type.id_symbol != spec.state_type.id_symbol ||
      again.state_type.info_symbol != spec.state_type.info_symbol) {
    std::abort();
  }
  return 0;
}
