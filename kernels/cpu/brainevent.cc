// libbrainevent.so: event-driven CSR sparse matrix-vector products of spiking
// networks (after brainevent's csr_matvec with binary events).
//
// A CSR matrix with m rows and k columns is (indptr S32[m+1], indices S32[nnz],
// data F32[nnz]); data F32[1] (or a 0-d F32) means one homogeneous weight for
// every stored entry. An event is spiking when its value is nonzero (PRED or
// F32); spikes select weights, they do not scale them.
//   CsrEventMatvec:  events[k] -> out[m],  out[i] = sum_{j in row i,
//                    events[indices[j]] != 0} data[j]
//   CsrEventMatvecT: events[m] -> out[k],  out[indices[j]] += data[j] for
//                    every j in a row i with events[i] != 0
// m and k are taken from the shapes; every shape and index is validated.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/dtypes.h"
#include "kernels/cpu/export.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace kreg::kernels {

using Indices = ffi::Buffer<ffi::S32, 1>;
using Vector = ffi::Buffer<ffi::F32, 1>;

namespace {

// Validated view of a CSR matrix; weight(j) handles homogeneous data.
struct Csr {
  const int32_t* indptr;
  const int32_t* indices;
  const float* data;
  bool homogeneous;
  size_t rows;
  float weight(size_t j) const { return homogeneous ? data[0] : data[j]; }
};

// Spike flags of an event vector as bytes (0/1).
ffi::ErrorOr<std::vector<uint8_t>> Spikes(const char* who,
                                          const ffi::AnyBuffer& events) {
  const size_t n = events.element_count();
  std::vector<uint8_t> spikes(n);
  if (events.dimensions().size() != 1) {
    return ffi::Error::InvalidArgument(
        std::string(who) + ": events must be 1-d, got shape " +
        ShapeString(events.dimensions().begin(), events.dimensions().size()));
  }
  switch (events.element_type()) {
    case ffi::PRED: {
      const uint8_t* p = static_cast<const uint8_t*>(events.untyped_data());
      for (size_t i = 0; i < n; ++i) spikes[i] = p[i] != 0;
      break;
    }
    case ffi::F32: {
      const float* p = static_cast<const float*>(events.untyped_data());
      for (size_t i = 0; i < n; ++i) spikes[i] = p[i] != 0.0f;
      break;
    }
    default:
      return ffi::Error::InvalidArgument(
          std::string(who) + ": events must be bool (pred) or f32, got " +
          DataTypeName(static_cast<XLA_FFI_DataType>(events.element_type())));
  }
  return spikes;
}

// Checks the CSR structure; `columns` bounds every column index.
ffi::ErrorOr<Csr> CheckCsr(const char* who, const Indices& indptr,
                           const Indices& indices,
                           const ffi::Buffer<ffi::F32>& data, size_t columns) {
  const std::string w(who);
  if (indptr.element_count() < 1) {
    return ffi::Error::InvalidArgument(w +
                                       ": indptr must have m+1 >= 1 entries");
  }
  const size_t rows = indptr.element_count() - 1;
  const size_t nnz = indices.element_count();
  const size_t nd = data.element_count();
  // With nnz == 1 a one-element data is per-entry and homogeneous at once.
  const bool homogeneous = nd == 1;
  const int32_t* ptr = indptr.typed_data();
  if (ptr[0] != 0) {
    return ffi::Error::InvalidArgument(w + ": indptr[0] must be 0, got " +
                                       std::to_string(ptr[0]));
  }
  for (size_t i = 0; i < rows; ++i) {
    if (ptr[i + 1] < ptr[i]) {
      return ffi::Error::InvalidArgument(
          w + ": indptr must be non-decreasing, indptr[" +
          std::to_string(i + 1) + "] = " + std::to_string(ptr[i + 1]) +
          " < indptr[" + std::to_string(i) + "] = " + std::to_string(ptr[i]));
    }
  }
  if (static_cast<size_t>(ptr[rows]) != nnz) {
    return ffi::Error::InvalidArgument(
        w + ": indptr[m] = " + std::to_string(ptr[rows]) +
        " does not match len(indices) = " + std::to_string(nnz));
  }
  if (data.dimensions().size() > 1 || (nd != nnz && nd != 1)) {
    return ffi::Error::InvalidArgument(
        w + ": data must have shape [nnz] = [" + std::to_string(nnz) +
        "] or [1] (homogeneous weight), got " +
        ShapeString(data.dimensions().begin(), data.dimensions().size()));
  }
  const int32_t* idx = indices.typed_data();
  for (size_t j = 0; j < nnz; ++j) {
    if (idx[j] < 0 || static_cast<size_t>(idx[j]) >= columns) {
      return ffi::Error::InvalidArgument(w + ": indices[" + std::to_string(j) +
                                         "] = " + std::to_string(idx[j]) +
                                         " is outside [0, " +
                                         std::to_string(columns) + ")");
    }
  }
  return Csr{ptr, idx, data.typed_data(), homogeneous, rows};
}

ffi::Error CsrEventMatvecImpl(Indices indptr, Indices indices,
                              ffi::Buffer<ffi::F32> data, ffi::AnyBuffer events,
                              ffi::Result<Vector> out) {
  constexpr char kWho[] = "brainevent.CsrEventMatvec";
  if (out->element_count() + 1 != indptr.element_count()) {
    return ffi::Error::InvalidArgument(
        std::string(kWho) + ": out has " +
        std::to_string(out->element_count()) + " rows but indptr has " +
        std::to_string(indptr.element_count()) + " entries (needs m+1)");
  }
  ffi::ErrorOr<std::vector<uint8_t>> spikes = Spikes(kWho, events);
  if (spikes.has_error()) return spikes.error();
  ffi::ErrorOr<Csr> csr = CheckCsr(kWho, indptr, indices, data, spikes->size());
  if (csr.has_error()) return csr.error();
  float* y = out->typed_data();
  for (size_t i = 0; i < csr->rows; ++i) {
    float acc = 0.0f;
    for (int32_t j = csr->indptr[i]; j < csr->indptr[i + 1]; ++j) {
      if ((*spikes)[csr->indices[j]]) acc += csr->weight(j);
    }
    y[i] = acc;
  }
  return ffi::Error::Success();
}

ffi::Error CsrEventMatvecTImpl(Indices indptr, Indices indices,
                               ffi::Buffer<ffi::F32> data,
                               ffi::AnyBuffer events, ffi::Result<Vector> out) {
  constexpr char kWho[] = "brainevent.CsrEventMatvecT";
  ffi::ErrorOr<std::vector<uint8_t>> spikes = Spikes(kWho, events);
  if (spikes.has_error()) return spikes.error();
  if (spikes->size() + 1 != indptr.element_count()) {
    return ffi::Error::InvalidArgument(
        std::string(kWho) + ": events has " + std::to_string(spikes->size()) +
        " entries but indptr has " + std::to_string(indptr.element_count()) +
        " (needs m+1 for m rows)");
  }
  const size_t columns = out->element_count();
  ffi::ErrorOr<Csr> csr = CheckCsr(kWho, indptr, indices, data, columns);
  if (csr.has_error()) return csr.error();
  float* y = out->typed_data();
  for (size_t c = 0; c < columns; ++c) y[c] = 0.0f;
  for (size_t i = 0; i < csr->rows; ++i) {
    if (!(*spikes)[i]) continue;
    for (int32_t j = csr->indptr[i]; j < csr->indptr[i + 1]; ++j) {
      y[csr->indices[j]] += csr->weight(j);
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace kreg::kernels

KREG_EXPORT_HANDLER(CsrEventMatvec);
KREG_EXPORT_HANDLER(CsrEventMatvecT);

XLA_FFI_DEFINE_HANDLER_SYMBOL(CsrEventMatvec, kreg::kernels::CsrEventMatvecImpl,
                              ffi::Ffi::Bind()
                                  .Arg<kreg::kernels::Indices>()  // indptr
                                  .Arg<kreg::kernels::Indices>()  // indices
                                  .Arg<ffi::Buffer<ffi::F32>>()   // data
                                  .Arg<ffi::AnyBuffer>()          // events
                                  .Ret<kreg::kernels::Vector>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(CsrEventMatvecT,
                              kreg::kernels::CsrEventMatvecTImpl,
                              ffi::Ffi::Bind()
                                  .Arg<kreg::kernels::Indices>()  // indptr
                                  .Arg<kreg::kernels::Indices>()  // indices
                                  .Arg<ffi::Buffer<ffi::F32>>()   // data
                                  .Arg<ffi::AnyBuffer>()          // events
                                  .Ret<kreg::kernels::Vector>());
