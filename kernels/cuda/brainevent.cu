// libbrainevent_cuda.so: CsrEventMatvec and CsrEventMatvecT, the CUDA twins of
// kernels/cpu/brainevent.cc (event-driven CSR sparse matrix-vector products
// with binary events; see that file for the maths).
//
// Shapes and dtypes are checked on the host with the CPU kernel's messages.
// The CSR *contents* (indptr monotone, indices in range) are not: that would
// need device memory on the host (a synchronisation). Instead the kernels
// never read or write out of bounds: a row's range is clamped to [0, nnz] and
// a column index outside [0, k) is skipped.
//
// CsrEventMatvec sums each row sequentially in index order, as the CPU kernel
// does (bit-identical results); CsrEventMatvecT scatters with atomics (sums in
// any order).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cpu/dtypes.h"
#include "kernels/cpu/export.h"
#include "kernels/cuda/cuda_util.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace kreg::kernels::cuda {

using Indices = ffi::Buffer<ffi::S32, 1>;
using Vector = ffi::Buffer<ffi::F32, 1>;

namespace {

// Device view of a CSR matrix with m rows, nnz entries, k columns.
struct Csr {
  const int32_t* indptr;
  const int32_t* indices;
  const float* data;
  bool homogeneous;
  int64_t rows;
  int64_t nnz;
  int64_t columns;
};

// Spike flag of event i (PRED bytes or F32).
struct Events {
  const void* data;
  bool is_pred;
  __device__ bool spiking(int64_t i) const {
    return is_pred ? static_cast<const uint8_t*>(data)[i] != 0
                   : static_cast<const float*>(data)[i] != 0.0f;
  }
};

__device__ int64_t Clamp(int64_t v, int64_t hi) {
  return v < 0 ? 0 : (v > hi ? hi : v);
}

__global__ void MatvecKernel(Csr csr, Events events, float* out) {
  KREG_GRID_STRIDE_LOOP(i, static_cast<size_t>(csr.rows)) {
    const int64_t begin = Clamp(csr.indptr[i], csr.nnz);
    const int64_t end = Clamp(csr.indptr[i + 1], csr.nnz);
    float acc = 0.0f;
    for (int64_t j = begin; j < end; ++j) {
      const int32_t c = csr.indices[j];
      if (c < 0 || c >= csr.columns || !events.spiking(c)) continue;
      acc += csr.homogeneous ? csr.data[0] : csr.data[j];
    }
    out[i] = acc;
  }
}

__global__ void MatvecTKernel(Csr csr, Events events, float* out) {
  KREG_GRID_STRIDE_LOOP(i, static_cast<size_t>(csr.rows)) {
    if (!events.spiking(i)) continue;
    const int64_t begin = Clamp(csr.indptr[i], csr.nnz);
    const int64_t end = Clamp(csr.indptr[i + 1], csr.nnz);
    for (int64_t j = begin; j < end; ++j) {
      const int32_t c = csr.indices[j];
      if (c < 0 || c >= csr.columns) continue;
      atomicAdd(out + c, csr.homogeneous ? csr.data[0] : csr.data[j]);
    }
  }
}

ffi::ErrorOr<Events> CheckEvents(const char* who,
                                 const ffi::AnyBuffer& events) {
  if (events.dimensions().size() != 1) {
    return ffi::Error::InvalidArgument(
        std::string(who) + ": events must be 1-d, got shape " +
        ShapeString(events.dimensions().begin(), events.dimensions().size()));
  }
  switch (events.element_type()) {
    case ffi::PRED:
      return Events{events.untyped_data(), true};
    case ffi::F32:
      return Events{events.untyped_data(), false};
    default:
      return ffi::Error::InvalidArgument(
          std::string(who) + ": events must be bool (pred) or f32, got " +
          DataTypeName(static_cast<XLA_FFI_DataType>(events.element_type())));
  }
}

// Shape checks of the CSR operands (contents stay on the device).
ffi::ErrorOr<Csr> CheckCsr(const char* who, const Indices& indptr,
                           const Indices& indices,
                           const ffi::Buffer<ffi::F32>& data, size_t columns) {
  const std::string w(who);
  if (indptr.element_count() < 1) {
    return ffi::Error::InvalidArgument(w +
                                       ": indptr must have m+1 >= 1 entries");
  }
  const size_t nnz = indices.element_count();
  const size_t nd = data.element_count();
  if (data.dimensions().size() > 1 || (nd != nnz && nd != 1)) {
    return ffi::Error::InvalidArgument(
        w + ": data must have shape [nnz] = [" + std::to_string(nnz) +
        "] or [1] (homogeneous weight), got " +
        ShapeString(data.dimensions().begin(), data.dimensions().size()));
  }
  return Csr{indptr.typed_data(),
             indices.typed_data(),
             data.typed_data(),
             nd == 1,
             static_cast<int64_t>(indptr.element_count() - 1),
             static_cast<int64_t>(nnz),
             static_cast<int64_t>(columns)};
}

ffi::Error CsrEventMatvecImpl(cudaStream_t stream, Indices indptr,
                              Indices indices, ffi::Buffer<ffi::F32> data,
                              ffi::AnyBuffer events, ffi::Result<Vector> out) {
  constexpr char kWho[] = "brainevent.CsrEventMatvec";
  if (out->element_count() + 1 != indptr.element_count()) {
    return ffi::Error::InvalidArgument(
        std::string(kWho) + ": out has " +
        std::to_string(out->element_count()) + " rows but indptr has " +
        std::to_string(indptr.element_count()) + " entries (needs m+1)");
  }
  ffi::ErrorOr<Events> ev = CheckEvents(kWho, events);
  if (ev.has_error()) return ev.error();
  ffi::ErrorOr<Csr> csr =
      CheckCsr(kWho, indptr, indices, data, events.element_count());
  if (csr.has_error()) return csr.error();
  if (csr->rows == 0) return ffi::Error::Success();
  MatvecKernel<<<BlocksFor(csr->rows), kThreads, 0, stream>>>(
      *csr, *ev, out->typed_data());
  return LastCudaError(kWho, "kernel launch");
}

ffi::Error CsrEventMatvecTImpl(cudaStream_t stream, Indices indptr,
                               Indices indices, ffi::Buffer<ffi::F32> data,
                               ffi::AnyBuffer events, ffi::Result<Vector> out) {
  constexpr char kWho[] = "brainevent.CsrEventMatvecT";
  ffi::ErrorOr<Events> ev = CheckEvents(kWho, events);
  if (ev.has_error()) return ev.error();
  if (events.element_count() + 1 != indptr.element_count()) {
    return ffi::Error::InvalidArgument(
        std::string(kWho) + ": events has " +
        std::to_string(events.element_count()) + " entries but indptr has " +
        std::to_string(indptr.element_count()) + " (needs m+1 for m rows)");
  }
  const size_t columns = out->element_count();
  ffi::ErrorOr<Csr> csr = CheckCsr(kWho, indptr, indices, data, columns);
  if (csr.has_error()) return csr.error();
  if (columns > 0) {
    if (ffi::Error err =
            CudaCall(kWho, "cudaMemsetAsync",
                     cudaMemsetAsync(out->typed_data(), 0,
                                     columns * sizeof(float), stream));
        err.failure()) {
      return err;
    }
  }
  if (csr->rows == 0 || columns == 0) return ffi::Error::Success();
  MatvecTKernel<<<BlocksFor(csr->rows), kThreads, 0, stream>>>(
      *csr, *ev, out->typed_data());
  return LastCudaError(kWho, "kernel launch");
}

}  // namespace
}  // namespace kreg::kernels::cuda

KREG_EXPORT_HANDLER(CsrEventMatvec);
KREG_EXPORT_HANDLER(CsrEventMatvecT);

using Stream = ffi::PlatformStream<cudaStream_t>;

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    CsrEventMatvec, kreg::kernels::cuda::CsrEventMatvecImpl,
    ffi::Ffi::Bind()
        .Ctx<Stream>()
        .Arg<kreg::kernels::cuda::Indices>()  // indptr
        .Arg<kreg::kernels::cuda::Indices>()  // indices
        .Arg<ffi::Buffer<ffi::F32>>()         // data
        .Arg<ffi::AnyBuffer>()                // events
        .Ret<kreg::kernels::cuda::Vector>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    CsrEventMatvecT, kreg::kernels::cuda::CsrEventMatvecTImpl,
    ffi::Ffi::Bind()
        .Ctx<Stream>()
        .Arg<kreg::kernels::cuda::Indices>()  // indptr
        .Arg<kreg::kernels::cuda::Indices>()  // indices
        .Arg<ffi::Buffer<ffi::F32>>()         // data
        .Arg<ffi::AnyBuffer>()                // events
        .Ret<kreg::kernels::cuda::Vector>());
