#include "kernels/cpu/dtypes.h"

namespace kreg::kernels {

std::string DataTypeName(XLA_FFI_DataType dtype) {
  switch (dtype) {
    case XLA_FFI_DataType_PRED:
      return "pred";
    case XLA_FFI_DataType_S8:
      return "s8";
    case XLA_FFI_DataType_S16:
      return "s16";
    case XLA_FFI_DataType_S32:
      return "s32";
    case XLA_FFI_DataType_S64:
      return "s64";
    case XLA_FFI_DataType_U8:
      return "u8";
    case XLA_FFI_DataType_U16:
      return "u16";
    case XLA_FFI_DataType_U32:
      return "u32";
    case XLA_FFI_DataType_U64:
      return "u64";
    case XLA_FFI_DataType_F16:
      return "f16";
    case XLA_FFI_DataType_BF16:
      return "bf16";
    case XLA_FFI_DataType_F32:
      return "f32";
    case XLA_FFI_DataType_F64:
      return "f64";
    case XLA_FFI_DataType_C64:
      return "c64";
    case XLA_FFI_DataType_C128:
      return "c128";
    case XLA_FFI_DataType_TOKEN:
      return "token";
    default:
      return "dtype<" + std::to_string(static_cast<int>(dtype)) + ">";
  }
}

size_t AttrElementBytes(XLA_FFI_DataType dtype) {
  switch (dtype) {
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8:
      return 1;
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16:
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
      return 2;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32:
    case XLA_FFI_DataType_F32:
      return 4;
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64:
    case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_C64:
      return 8;
    case XLA_FFI_DataType_C128:
      return 16;
    default:
      return 0;
  }
}

std::string ShapeString(const int64_t* dims, size_t rank) {
  std::string out = "[";
  for (size_t i = 0; i < rank; ++i) {
    if (i > 0) out += ",";
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

}  // namespace kreg::kernels
