#include "daemon/executor/launch_fields.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "daemon/base/validate.h"

namespace kreg {
namespace {

// Byte width of a dtype usable in a buffer or attribute, or an error.
absl::StatusOr<int> CheckedWidth(int32_t dtype, const std::string& what) {
  int width = DtypeByteWidth(dtype);
  if (width < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": dtype code ", dtype, " is not an XLA FFI data type"));
  }
  if (width == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype ", DtypeName(dtype), " (code ", dtype,
                     ") has no byte width; kregd forwards only types of "
                     "whole bytes"));
  }
  return width;
}

struct AttrBudget {
  int remaining = kMaxLaunchAttrs;
};

absl::StatusOr<AttrList> DecodeAttrList(
    const google::protobuf::RepeatedPtrField<v1::Attribute>& attrs,
    const std::string& prefix, int depth, AttrBudget* budget);

// `path` is the attribute's dotted name ("outer.inner").
absl::StatusOr<Attr> DecodeAttr(const v1::Attribute& a, const std::string& path,
                                int depth, AttrBudget* budget) {
  const std::string what = "attribute " + path;
  Attr out;
  switch (a.kind()) {
    case v1::ATTR_KIND_SCALAR: {
      KREG_ASSIGN_OR_RETURN(int width, CheckedWidth(a.dtype(), what));
      if (a.data().size() != static_cast<size_t>(width)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": scalar of dtype ", DtypeName(a.dtype()),
                         " needs ", width, " bytes, got ", a.data().size()));
      }
      out.kind = Attr::Kind::kScalar;
      out.dtype = a.dtype();
      out.bytes = a.data();
      return out;
    }
    case v1::ATTR_KIND_ARRAY: {
      KREG_ASSIGN_OR_RETURN(int width, CheckedWidth(a.dtype(), what));
      uint64_t need;
      if (a.count() < 0 ||
          __builtin_mul_overflow(static_cast<uint64_t>(a.count()),
                                 static_cast<uint64_t>(width), &need) ||
          need != a.data().size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": array of ", a.count(), " ", DtypeName(a.dtype()),
            " elements does not match its ", a.data().size(), " data bytes"));
      }
      out.kind = Attr::Kind::kArray;
      out.dtype = a.dtype();
      out.count = a.count();
      out.bytes = a.data();
      return out;
    }
    case v1::ATTR_KIND_STRING:
      out.kind = Attr::Kind::kString;
      out.bytes = a.data();
      return out;
    case v1::ATTR_KIND_DICT: {
      if (depth >= kMaxAttrDepth) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": dictionaries nest deeper than ",
                         kMaxAttrDepth, " levels"));
      }
      KREG_ASSIGN_OR_RETURN(AttrList dict, DecodeAttrList(a.dict(), path + ".",
                                                          depth + 1, budget));
      out.kind = Attr::Kind::kDict;
      out.dict = std::move(dict);
      return out;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": unknown attribute kind ", a.kind()));
  }
}

absl::StatusOr<AttrList> DecodeAttrList(
    const google::protobuf::RepeatedPtrField<v1::Attribute>& attrs,
    const std::string& prefix, int depth, AttrBudget* budget) {
  AttrList out;
  out.reserve(attrs.size());
  for (int i = 0; i < attrs.size(); ++i) {
    const v1::Attribute& a = attrs.Get(i);
    if (--budget->remaining < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "launch carries more than ", kMaxLaunchAttrs, " attributes"));
    }
    if (a.name().empty() || a.name().size() > kMaxAttrNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attribute ", prefix, "#", i, " name ", QuoteForMessage(a.name()),
          " must be 1-", kMaxAttrNameBytes, " bytes"));
    }
    std::string path = absl::StrCat(prefix, a.name());
    if (i > 0 && !(attrs.Get(i - 1).name() < a.name())) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute names must be sorted and unique: ",
                       QuoteForMessage(prefix + a.name()), " follows ",
                       QuoteForMessage(prefix + attrs.Get(i - 1).name())));
    }
    KREG_ASSIGN_OR_RETURN(Attr attr, DecodeAttr(a, path, depth, budget));
    out.emplace_back(a.name(), std::move(attr));
  }
  return out;
}

// dtype, rank, dims and size of a buffer (everything but where it lives).
absl::Status CheckBufferShape(int32_t dtype, const int64_t* dims, size_t rank,
                              uint64_t size, const std::string& what) {
  KREG_ASSIGN_OR_RETURN(int width, CheckedWidth(dtype, what));
  if (rank > static_cast<size_t>(kMaxLaunchRank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": rank ", rank, " exceeds the maximum of ", kMaxLaunchRank));
  }
  auto dims_text = [&] {
    return absl::StrCat(
        "[", absl::StrJoin(absl::MakeConstSpan(dims, rank), ", "), "]");
  };
  uint64_t bytes = static_cast<uint64_t>(width);
  for (size_t i = 0; i < rank; ++i) {
    int64_t d = dims[i];
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dims[", i, "] = ", d, " is negative (dims ",
                       dims_text(), ")"));
    }
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": byte size of dims ", dims_text(), " overflows 64 bits"));
    }
  }
  if (bytes != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dims ", dims_text(), " of ", DtypeName(dtype),
                     " need ", bytes, " bytes but the buffer has ", size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeArenaBuffer(int32_t dtype, const int64_t* dims, size_t rank,
                               uint64_t offset, uint64_t size,
                               const ShmArena& arena, const std::string& what,
                               BufferRef* out) {
  KREG_RETURN_IF_ERROR(CheckBufferShape(dtype, dims, rank, size, what));
  absl::StatusOr<char*> data = arena.Region(offset, size);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat(what, ": ", data.status().message()));
  }
  // XLA hands handlers 64-byte-aligned buffers (and the shim places them
  // so): a handler may rely on it (aligned SIMD loads), so a hostile
  // client must not be able to break it.
  if (size > 0 && offset % kArenaBufferAlign != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": arena offset ", offset, " is not a multiple of ",
                     kArenaBufferAlign,
                     " (buffers are 64-byte aligned, as XLA aligns them)"));
  }
  out->dtype = dtype;
  out->dims.assign(dims, dims + rank);
  out->data = *data;
  return absl::OkStatus();
}

absl::Status DecodeBufferShape(int32_t dtype, const int64_t* dims, size_t rank,
                               uint64_t size, const std::string& what,
                               BufferRef* out) {
  KREG_RETURN_IF_ERROR(CheckBufferShape(dtype, dims, rank, size, what));
  out->dtype = dtype;
  out->dims.assign(dims, dims + rank);
  out->data = nullptr;
  return absl::OkStatus();
}

absl::Status DecodeCudaBufferFields(int32_t dtype, const int64_t* dims,
                                    size_t rank, const CudaRefView* ref,
                                    uint64_t offset, uint64_t size,
                                    const CudaBufferResolver& cuda,
                                    const std::string& what, BufferRef* out) {
  KREG_RETURN_IF_ERROR(CheckBufferShape(dtype, dims, rank, size, what));
  out->dtype = dtype;
  out->dims.assign(dims, dims + rank);
  out->data = nullptr;
  if (size == 0) return absl::OkStatus();  // null, as ring_layout.h says
  if (ref == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a CUDA launch's buffer of ", size,
                     " bytes names no CUDA allocation"));
  }
  KREG_ASSIGN_OR_RETURN(out->data, cuda(*ref, offset, size, what));
  return absl::OkStatus();
}

absl::StatusOr<AttrList> DecodeAttrs(
    const google::protobuf::RepeatedPtrField<v1::Attribute>& attrs) {
  AttrBudget budget;
  return DecodeAttrList(attrs, "", 0, &budget);
}

}  // namespace kreg
