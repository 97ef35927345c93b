// Short lower-case names of XLA FFI dtypes ("f32", "s64", "pred", ...), as
// JAX and NumPy spell them. Used in kernel error messages and AttrsDigest.

#ifndef KREGD_KERNELS_CPU_DTYPES_H_
#define KREGD_KERNELS_CPU_DTYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "xla/ffi/api/c_api.h"

namespace kreg::kernels {

// Name of `dtype`; "dtype<N>" for values this file does not know.
std::string DataTypeName(XLA_FFI_DataType dtype);

// Bytes per element of the dtypes that AttrsDigest serialises (PRED, integers,
// F16, BF16, F32, F64, C64, C128); 0 for any other dtype.
size_t AttrElementBytes(XLA_FFI_DataType dtype);

// "[d0,d1,...]" ("[]" for rank 0).
std::string ShapeString(const int64_t* dims, size_t rank);

}  // namespace kreg::kernels

#endif  // KREGD_KERNELS_CPU_DTYPES_H_
