#include "daemon/executor/ffi/call_frame.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

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

const char* KindName(Attr::Kind kind) {
  switch (kind) {
    case Attr::Kind::kScalar:
      return "scalar";
    case Attr::Kind::kArray:
      return "array";
    case Attr::Kind::kString:
      return "string";
    case Attr::Kind::kDict:
      return "dictionary";
  }
  return "unknown";
}

}  // namespace

size_t AttrByteWidth(int32_t dtype) {
  return static_cast<size_t>(std::max(DtypeByteWidth(dtype), 0));
}

bool IsKnownDataType(int32_t dtype) { return DtypeByteWidth(dtype) >= 0; }

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

absl::StatusOr<std::unique_ptr<CallFrameStorage>> CallFrameStorage::Build(
    const LaunchFrame& frame) {
  auto storage = std::make_unique<CallFrameStorage>();
  if (absl::Status s = storage->Prepare(frame); !s.ok()) return s;
  return storage;
}

absl::Status CallFrameStorage::Prepare(const LaunchFrame& frame) {
  if (absl::Status s = BuildBuffers(frame); !s.ok()) return s;
  ++clock_;
  AttrTables* tables = nullptr;
  if (frame.attrs_generation != 0) {
    for (AttrTables& t : attr_tables_) {
      if (t.generation == frame.attrs_generation) tables = &t;
    }
  }
  if (tables == nullptr) {
    // An unusable set first (generation 0: a frame that promised nothing,
    // or a failed build), then a new one, then the least recently used.
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
    if (absl::Status s = Charge(tables, AttrTablesBytes(frame.attrs));
        !s.ok()) {
      return s;
    }
    building_ = tables;
    absl::Status s = BuildAttrs(frame.attrs, 0, "", &tables->attrs);
    building_ = nullptr;
    if (!s.ok()) {
      Drop(tables);
      return s;
    }
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

absl::Status CallFrameStorage::BuildBuffers(const LaunchFrame& frame) {
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

  auto add = [this](const BufferRef& buffer, const char* what,
                    size_t index) -> absl::StatusOr<XLA_FFI_Buffer*> {
    if (!IsKnownDataType(buffer.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", index, " has unknown dtype ", buffer.dtype));
    }
    int64_t* dims = dims_.data() + dims_.size();
    for (int64_t dim : buffer.dims) {
      if (dim < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " ", index, " has negative dimension ", dim));
      }
      dims_.push_back(dim);
    }
    buffers_.push_back(
        XLA_FFI_Buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr,
                       static_cast<XLA_FFI_DataType>(buffer.dtype), buffer.data,
                       static_cast<int64_t>(buffer.dims.size()), dims});
    return &buffers_.back();
  };

  for (size_t i = 0; i < frame.args.size(); ++i) {
    absl::StatusOr<XLA_FFI_Buffer*> buffer = add(frame.args[i], "arg", i);
    if (!buffer.ok()) return buffer.status();
    arg_types_.push_back(XLA_FFI_ArgType_BUFFER);
    arg_ptrs_.push_back(*buffer);
  }
  for (size_t i = 0; i < frame.rets.size(); ++i) {
    absl::StatusOr<XLA_FFI_Buffer*> buffer = add(frame.rets[i], "ret", i);
    if (!buffer.ok()) return buffer.status();
    ret_types_.push_back(XLA_FFI_RetType_BUFFER);
    ret_ptrs_.push_back(*buffer);
  }
  return absl::OkStatus();
}

absl::Status CallFrameStorage::BuildAttrs(const AttrList& list, int depth,
                                          const std::string& path,
                                          XLA_FFI_Attrs* out) {
  if (depth > kMaxAttrDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute dictionaries are nested deeper than ",
                     kMaxAttrDepth, " levels at \"", path, "\""));
  }
  // XLA passes attributes sorted by name; handlers binary-search them.
  std::vector<const AttrList::value_type*> sorted;
  sorted.reserve(list.size());
  for (const auto& entry : list) sorted.push_back(&entry);
  std::stable_sort(
      sorted.begin(), sorted.end(),
      [](const auto* a, const auto* b) { return a->first < b->first; });

  const size_t n = sorted.size();
  auto* types = Own(std::vector<XLA_FFI_AttrType>(n));
  auto* spans = Own(std::vector<XLA_FFI_ByteSpan>(n));
  auto* names = Own(std::vector<XLA_FFI_ByteSpan*>(n));
  auto* values = Own(std::vector<void*>(n));

  for (size_t i = 0; i < n; ++i) {
    const std::string& name = sorted[i]->first;
    const Attr& attr = sorted[i]->second;
    const std::string full_name = path + name;
    if (i > 0 && sorted[i - 1]->first == name) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute \"", full_name, "\" appears twice"));
    }
    (*spans)[i] = XLA_FFI_ByteSpan{name.data(), name.size()};
    (*names)[i] = &(*spans)[i];

    if (attr.kind == Attr::Kind::kScalar || attr.kind == Attr::Kind::kArray) {
      size_t width = AttrByteWidth(attr.dtype);
      if (width == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(KindName(attr.kind), " attribute \"", full_name,
                         "\" has unsupported dtype ", attr.dtype));
      }
      size_t count = 1;
      if (attr.kind == Attr::Kind::kArray) {
        if (attr.count < 0 || static_cast<uint64_t>(attr.count) >
                                  std::numeric_limits<size_t>::max() / width) {
          return absl::InvalidArgumentError(
              absl::StrCat("array attribute \"", full_name,
                           "\" has invalid element count ", attr.count));
        }
        count = static_cast<size_t>(attr.count);
      }
      if (attr.bytes.size() != count * width) {
        return absl::InvalidArgumentError(absl::StrCat(
            KindName(attr.kind), " attribute \"", full_name, "\" (dtype ",
            attr.dtype, ", ", count, " element(s)) has ", attr.bytes.size(),
            " bytes, expected ", count * width));
      }
      std::vector<uint64_t>* words = Own(AlignedCopy(attr.bytes));
      auto dtype = static_cast<XLA_FFI_DataType>(attr.dtype);
      if (attr.kind == Attr::Kind::kScalar) {
        (*types)[i] = XLA_FFI_AttrType_SCALAR;
        (*values)[i] = Own(XLA_FFI_Scalar{dtype, words->data()});
      } else {
        (*types)[i] = XLA_FFI_AttrType_ARRAY;
        (*values)[i] = Own(XLA_FFI_Array{dtype, count, words->data()});
      }
    } else if (attr.kind == Attr::Kind::kString) {
      (*types)[i] = XLA_FFI_AttrType_STRING;
      (*values)[i] =
          Own(XLA_FFI_ByteSpan{attr.bytes.data(), attr.bytes.size()});
    } else if (attr.kind == Attr::Kind::kDict) {
      XLA_FFI_Attrs* nested = Own(XLA_FFI_Attrs{});
      absl::Status status =
          BuildAttrs(attr.dict, depth + 1, full_name + ".", nested);
      if (!status.ok()) return status;
      (*types)[i] = XLA_FFI_AttrType_DICTIONARY;
      (*values)[i] = nested;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute \"", full_name, "\" has unknown kind ",
                       static_cast<int>(attr.kind)));
    }
  }

  *out = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE,
                       nullptr,
                       static_cast<int64_t>(n),
                       types->data(),
                       names->data(),
                       values->data()};
  return absl::OkStatus();
}

}  // namespace ffi_internal
}  // namespace kreg
