#include "daemon/executor/ffi/call_frame.h"

#include <cstring>

#include "common/status_macros.h"

namespace kreg {
namespace ffi_internal {
namespace {

// A copy of `bytes` at 8-byte alignment, enough for every attribute dtype
// (handlers dereference scalar and array values as their native type).
std::vector<uint64_t> AlignedCopy(const std::string& bytes) {
  std::vector<uint64_t> words((bytes.size() + 7) / 8);
  if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
  return words;
}

}  // namespace

uint64_t AttrTablesBytes(const AttrList& list) {
  // A shared_ptr's control block and the object's own header, per Own().
  constexpr uint64_t kOwned = 64;
  const uint64_t n = list.size();
  uint64_t bytes =
      4 * kOwned + n * (sizeof(XLA_FFI_AttrType) + sizeof(XLA_FFI_ByteSpan) +
                        2 * sizeof(void*));
  for (const auto& [name, attr] : list) {
    switch (attr.kind) {
      case Attr::Kind::kScalar:
      case Attr::Kind::kArray:
        bytes += 2 * kOwned + sizeof(XLA_FFI_Array) +
                 (attr.bytes.size() + 7) / 8 * 8;
        break;
      case Attr::Kind::kString:
        bytes += kOwned + sizeof(XLA_FFI_ByteSpan);
        break;
      case Attr::Kind::kDict:
        bytes += kOwned + sizeof(XLA_FFI_Attrs) + AttrTablesBytes(attr.dict);
        break;
    }
  }
  return bytes;
}

void CallFrameStorage::Drop(AttrTables* t) {
  t->generation = 0;
  t->owned.clear();
  t->attrs = XLA_FFI_Attrs{};
  t->hold.Set(0);
}

absl::Status CallFrameStorage::Charge(AttrTables* t, uint64_t need) {
  while (!t->hold.Set(need)) {
    AttrTables* victim = nullptr;
    for (AttrTables& other : attr_tables_) {
      if (&other != t && other.hold.held() > 0 &&
          (victim == nullptr || other.used < victim->used)) {
        victim = &other;
      }
    }
    if (victim == nullptr) {
      return absl::ResourceExhaustedError(
          wire::OverBudgetText(*budget_, need,
                               "the launch's attribute tables (call frame "
                               "cache)"));
    }
    Drop(victim);
  }
  return absl::OkStatus();
}

uint64_t CallFrameStorage::charged_bytes() const {
  uint64_t n = 0;
  for (const AttrTables& t : attr_tables_) n += t.hold.held();
  return n;
}

absl::Status CallFrameStorage::Prepare(const LaunchFrame& frame) {
  BuildBuffers(frame);
  ++clock_;
  AttrTables* tables = nullptr;
  if (frame.attrs_generation != 0) {
    for (AttrTables& t : attr_tables_) {
      if (t.generation == frame.attrs_generation) tables = &t;
    }
  }
  if (tables == nullptr) {
    // An unusable set first (generation 0: a frame that promised nothing),
    // then a new one, then the least recently used.
    for (AttrTables& t : attr_tables_) {
      if (t.generation == 0) tables = &t;
    }
    if (tables == nullptr && attr_tables_.size() < kAttrTables) {
      tables = &attr_tables_.emplace_back();
      tables->hold = wire::BudgetHold(budget_);
    }
    if (tables == nullptr) {
      tables = &attr_tables_[0];
      for (AttrTables& t : attr_tables_) {
        if (t.used < tables->used) tables = &t;
      }
    }
    Drop(tables);
    KREG_RETURN_IF_ERROR(Charge(tables, AttrTablesBytes(frame.attrs)));
    building_ = tables;
    BuildAttrs(frame.attrs, &tables->attrs);
    building_ = nullptr;
    tables->generation = frame.attrs_generation;
  }
  tables->used = clock_;

  // Every field, every call: a handler may have written to the last frame.
  XLA_FFI_CallFrame& f = frame_;
  f.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  f.extension_start = nullptr;
  f.api = nullptr;
  f.ctx = nullptr;
  f.stage = XLA_FFI_ExecutionStage_EXECUTE;
  f.args = XLA_FFI_Args{XLA_FFI_Args_STRUCT_SIZE, nullptr,
                        static_cast<int64_t>(arg_ptrs_.size()),
                        arg_types_.data(), arg_ptrs_.data()};
  f.rets = XLA_FFI_Rets{XLA_FFI_Rets_STRUCT_SIZE, nullptr,
                        static_cast<int64_t>(ret_ptrs_.size()),
                        ret_types_.data(), ret_ptrs_.data()};
  f.attrs = tables->attrs;
  f.future = nullptr;
  return absl::OkStatus();
}

void CallFrameStorage::BuildBuffers(const LaunchFrame& frame) {
  size_t total_rank = 0;
  for (const auto* list : {&frame.args, &frame.rets}) {
    for (const BufferRef& buffer : *list) total_rank += buffer.dims.size();
  }
  // Sized before any pointer is taken: the pointers taken below stay valid.
  buffers_.clear();
  dims_.clear();
  arg_types_.clear();
  arg_ptrs_.clear();
  ret_types_.clear();
  ret_ptrs_.clear();
  buffers_.reserve(frame.args.size() + frame.rets.size());
  dims_.reserve(total_rank);

  auto add = [this](const BufferRef& buffer) {
    int64_t* dims = dims_.data() + dims_.size();
    dims_.insert(dims_.end(), buffer.dims.begin(), buffer.dims.end());
    buffers_.push_back(
        XLA_FFI_Buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr,
                       static_cast<XLA_FFI_DataType>(buffer.dtype), buffer.data,
                       static_cast<int64_t>(buffer.dims.size()), dims});
    return &buffers_.back();
  };
  for (const BufferRef& buffer : frame.args) {
    arg_types_.push_back(XLA_FFI_ArgType_BUFFER);
    arg_ptrs_.push_back(add(buffer));
  }
  for (const BufferRef& buffer : frame.rets) {
    ret_types_.push_back(XLA_FFI_RetType_BUFFER);
    ret_ptrs_.push_back(add(buffer));
  }
}

void CallFrameStorage::BuildAttrs(const AttrList& list, XLA_FFI_Attrs* out) {
  const size_t n = list.size();
  auto* types = Own(std::vector<XLA_FFI_AttrType>(n));
  auto* spans = Own(std::vector<XLA_FFI_ByteSpan>(n));
  auto* names = Own(std::vector<XLA_FFI_ByteSpan*>(n));
  auto* values = Own(std::vector<void*>(n));
  for (size_t i = 0; i < n; ++i) {
    const auto& [name, attr] = list[i];
    (*spans)[i] = XLA_FFI_ByteSpan{name.data(), name.size()};
    (*names)[i] = &(*spans)[i];
    const auto dtype = static_cast<XLA_FFI_DataType>(attr.dtype);
    switch (attr.kind) {
      case Attr::Kind::kScalar:
        (*types)[i] = XLA_FFI_AttrType_SCALAR;
        (*values)[i] =
            Own(XLA_FFI_Scalar{dtype, Own(AlignedCopy(attr.bytes))->data()});
        break;
      case Attr::Kind::kArray:
        (*types)[i] = XLA_FFI_AttrType_ARRAY;
        (*values)[i] = Own(XLA_FFI_Array{dtype, static_cast<size_t>(attr.count),
                                         Own(AlignedCopy(attr.bytes))->data()});
        break;
      case Attr::Kind::kString:
        (*types)[i] = XLA_FFI_AttrType_STRING;
        (*values)[i] =
            Own(XLA_FFI_ByteSpan{attr.bytes.data(), attr.bytes.size()});
        break;
      case Attr::Kind::kDict: {
        XLA_FFI_Attrs* nested = Own(XLA_FFI_Attrs{});
        BuildAttrs(attr.dict, nested);
        (*types)[i] = XLA_FFI_AttrType_DICTIONARY;
        (*values)[i] = nested;
        break;
      }
    }
  }
  *out = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE,
                       nullptr,
                       static_cast<int64_t>(n),
                       types->data(),
                       names->data(),
                       values->data()};
}

}  // namespace ffi_internal
}  // namespace kreg
