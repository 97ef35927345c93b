#include "common/dtype.h"

#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

struct DtypeInfo {
  int32_t code;
  int width;
  const char* name;
};

constexpr DtypeInfo kDtypes[] = {
    {XLA_FFI_DataType_PRED, 1, "PRED"},
    {XLA_FFI_DataType_S1, 0, "S1"},
    {XLA_FFI_DataType_S2, 0, "S2"},
    {XLA_FFI_DataType_S4, 0, "S4"},
    {XLA_FFI_DataType_S8, 1, "S8"},
    {XLA_FFI_DataType_S16, 2, "S16"},
    {XLA_FFI_DataType_S32, 4, "S32"},
    {XLA_FFI_DataType_S64, 8, "S64"},
    {XLA_FFI_DataType_U1, 0, "U1"},
    {XLA_FFI_DataType_U2, 0, "U2"},
    {XLA_FFI_DataType_U4, 0, "U4"},
    {XLA_FFI_DataType_U8, 1, "U8"},
    {XLA_FFI_DataType_U16, 2, "U16"},
    {XLA_FFI_DataType_U32, 4, "U32"},
    {XLA_FFI_DataType_U64, 8, "U64"},
    {XLA_FFI_DataType_F16, 2, "F16"},
    {XLA_FFI_DataType_F32, 4, "F32"},
    {XLA_FFI_DataType_F64, 8, "F64"},
    {XLA_FFI_DataType_BF16, 2, "BF16"},
    {XLA_FFI_DataType_C64, 8, "C64"},
    {XLA_FFI_DataType_C128, 16, "C128"},
    {XLA_FFI_DataType_TOKEN, 0, "TOKEN"},
    {XLA_FFI_DataType_F8E5M2, 1, "F8E5M2"},
    {XLA_FFI_DataType_F8E3M4, 1, "F8E3M4"},
    {XLA_FFI_DataType_F8E4M3, 1, "F8E4M3"},
    {XLA_FFI_DataType_F8E4M3FN, 1, "F8E4M3FN"},
    {XLA_FFI_DataType_F8E4M3B11FNUZ, 1, "F8E4M3B11FNUZ"},
    {XLA_FFI_DataType_F8E5M2FNUZ, 1, "F8E5M2FNUZ"},
    {XLA_FFI_DataType_F8E4M3FNUZ, 1, "F8E4M3FNUZ"},
    {XLA_FFI_DataType_F4E2M1FN, 0, "F4E2M1FN"},
    {XLA_FFI_DataType_F8E8M0FNU, 1, "F8E8M0FNU"},
};

const DtypeInfo* Find(int32_t dtype) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.code == dtype) return &d;
  }
  return nullptr;
}

}  // namespace

int DtypeByteWidth(int32_t dtype) {
  const DtypeInfo* d = Find(dtype);
  return d ? d->width : -1;
}

const char* DtypeName(int32_t dtype) {
  const DtypeInfo* d = Find(dtype);
  return d ? d->name : "?";
}

}  // namespace kreg
