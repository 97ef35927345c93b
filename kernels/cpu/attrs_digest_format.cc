#include "kernels/cpu/attrs_digest_format.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "kernels/cpu/dtypes.h"

namespace ffi = xla::ffi;

namespace kreg::kernels {
namespace {

std::string_view NameOf(const XLA_FFI_Attrs* attrs, int64_t i) {
  return std::string_view(attrs->names[i]->ptr, attrs->names[i]->len);
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string Hex(uint64_t bits, int digits) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%0*llx", digits,
                static_cast<unsigned long long>(bits));
  return buf;
}

// Appends one element of `dtype` read from `p`; false if dtype is unknown.
bool AppendElement(XLA_FFI_DataType dtype, const char* p, std::string* out) {
  switch (dtype) {
    case XLA_FFI_DataType_PRED:
      *out += Load<uint8_t>(p) ? "true" : "false";
      return true;
    case XLA_FFI_DataType_S8:
      *out += std::to_string(Load<int8_t>(p));
      return true;
    case XLA_FFI_DataType_S16:
      *out += std::to_string(Load<int16_t>(p));
      return true;
    case XLA_FFI_DataType_S32:
      *out += std::to_string(Load<int32_t>(p));
      return true;
    case XLA_FFI_DataType_S64:
      *out += std::to_string(Load<int64_t>(p));
      return true;
    case XLA_FFI_DataType_U8:
      *out += std::to_string(Load<uint8_t>(p));
      return true;
    case XLA_FFI_DataType_U16:
      *out += std::to_string(Load<uint16_t>(p));
      return true;
    case XLA_FFI_DataType_U32:
      *out += std::to_string(Load<uint32_t>(p));
      return true;
    case XLA_FFI_DataType_U64:
      *out += std::to_string(Load<uint64_t>(p));
      return true;
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
      *out += Hex(Load<uint16_t>(p), 4);
      return true;
    case XLA_FFI_DataType_F32:
      *out += Hex(Load<uint32_t>(p), 8);
      return true;
    case XLA_FFI_DataType_F64:
      *out += Hex(Load<uint64_t>(p), 16);
      return true;
    case XLA_FFI_DataType_C64:
      *out += "(" + Hex(Load<uint32_t>(p), 8) + "," +
              Hex(Load<uint32_t>(p + 4), 8) + ")";
      return true;
    case XLA_FFI_DataType_C128:
      *out += "(" + Hex(Load<uint64_t>(p), 16) + "," +
              Hex(Load<uint64_t>(p + 8), 16) + ")";
      return true;
    default:
      return false;
  }
}

ffi::Error Unsupported(std::string_view path, XLA_FFI_DataType dtype) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    "AttrsDigest: attribute '" + std::string(path) +
                        "' has unsupported dtype " + DataTypeName(dtype));
}

ffi::Error AppendDict(const XLA_FFI_Attrs* attrs, const std::string& prefix,
                      std::string* out);

ffi::Error AppendValue(XLA_FFI_AttrType type, void* attr,
                       const std::string& path, std::string* out) {
  switch (type) {
    case XLA_FFI_AttrType_SCALAR: {
      auto* scalar = static_cast<const XLA_FFI_Scalar*>(attr);
      *out += DataTypeName(scalar->dtype) + ":";
      if (!AppendElement(scalar->dtype, static_cast<const char*>(scalar->value),
                         out)) {
        return Unsupported(path, scalar->dtype);
      }
      return ffi::Error::Success();
    }
    case XLA_FFI_AttrType_ARRAY: {
      auto* array = static_cast<const XLA_FFI_Array*>(attr);
      const size_t width = AttrElementBytes(array->dtype);
      if (width == 0) return Unsupported(path, array->dtype);
      *out +=
          DataTypeName(array->dtype) + "[" + std::to_string(array->size) + "]:";
      const char* data = static_cast<const char*>(array->data);
      for (size_t i = 0; i < array->size; ++i) {
        if (i > 0) *out += ",";
        AppendElement(array->dtype, data + i * width, out);
      }
      return ffi::Error::Success();
    }
    case XLA_FFI_AttrType_STRING: {
      auto* span = static_cast<const XLA_FFI_ByteSpan*>(attr);
      *out += "str[" + std::to_string(span->len) + "]:";
      out->append(span->ptr, span->len);
      return ffi::Error::Success();
    }
    case XLA_FFI_AttrType_DICTIONARY:
      *out += "dict";
      return AppendDict(static_cast<const XLA_FFI_Attrs*>(attr), path + ".",
                        out);
  }
  return ffi::Error::InvalidArgument("AttrsDigest: attribute '" + path +
                                     "' has unknown attribute type " +
                                     std::to_string(static_cast<int>(type)));
}

ffi::Error AppendDict(const XLA_FFI_Attrs* attrs, const std::string& prefix,
                      std::string* out) {
  *out += "{";
  for (int64_t i = 0; i < attrs->size; ++i) {
    const std::string_view name = NameOf(attrs, i);
    if (i > 0 && !(NameOf(attrs, i - 1) < name)) {
      return ffi::Error::InvalidArgument(
          "AttrsDigest: attribute names are not sorted: '" + prefix +
          std::string(NameOf(attrs, i - 1)) + "' comes before '" + prefix +
          std::string(name) + "'");
    }
    out->append(name);
    *out += "=";
    if (ffi::Error err = AppendValue(attrs->types[i], attrs->attrs[i],
                                     prefix + std::string(name), out);
        err.failure()) {
      return err;
    }
    *out += ";";
  }
  *out += "}";
  return ffi::Error::Success();
}

}  // namespace

ffi::ErrorOr<std::string> AttrsDigestText(const XLA_FFI_Attrs* attrs) {
  std::string digest;
  if (ffi::Error err = AppendDict(attrs, "", &digest); err.failure()) {
    return err;
  }
  return digest;
}

}  // namespace kreg::kernels
