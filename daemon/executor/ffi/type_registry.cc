#include "daemon/executor/ffi/type_registry.h"

#include "absl/strings/str_cat.h"

namespace kreg {
namespace ffi_internal {

TypeRegistry& TypeRegistry::Global() {
  static TypeRegistry* registry = new TypeRegistry();  // never destroyed
  return *registry;
}

absl::Status TypeRegistry::Register(absl::string_view name,
                                    XLA_FFI_TypeId* type_id,
                                    const XLA_FFI_TypeInfo* type_info) {
  if (name.empty()) {
    return absl::InvalidArgumentError("type name is empty");
  }
  if (type_id == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("type id pointer for type \"", name, "\" is null"));
  }
  if (type_id->type_id < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "type id ", type_id->type_id, " for type \"", name, "\" is negative"));
  }
  Deleter deleter = nullptr;
  if (type_info != nullptr &&
      type_info->struct_size >= XLA_FFI_TypeInfo_STRUCT_SIZE) {
    deleter = type_info->deleter;
  }

  absl::MutexLock lock(&mu_);
  auto it = ids_.find(name);
  if (it != ids_.end()) {
    if (type_id->type_id != 0 && type_id->type_id != it->second) {
      return absl::AlreadyExistsError(absl::StrCat(
          "type \"", name, "\" is already registered with type id ", it->second,
          ", not ", type_id->type_id));
    }
    type_id->type_id = it->second;
    return absl::OkStatus();
  }

  int64_t id = type_id->type_id;
  if (id == 0) {
    while (entries_.count(next_id_) != 0) ++next_id_;
    id = next_id_++;
  } else if (auto taken = entries_.find(id); taken != entries_.end()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "type id ", id, " requested for type \"", name,
        "\" already belongs to type \"", taken->second.name, "\""));
  }
  ids_.emplace(std::string(name), id);
  entries_.emplace(id, Entry{std::string(name), deleter});
  type_id->type_id = id;
  return absl::OkStatus();
}

TypeRegistry::Deleter TypeRegistry::DeleterOf(int64_t type_id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(type_id);
  return it == entries_.end() ? nullptr : it->second.deleter;
}

}  // namespace ffi_internal
}  // namespace kreg
