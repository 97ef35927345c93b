// libdemo_cuda.so: AddMul, Fail, AttrsDigest, Accumulate, AccumulateInPlace
// and ScratchSum, the CUDA twins of kernels/cpu's handlers (Scale is in
// scale.cu). Every handler queues its work on XLA's stream and returns
// without synchronising; see README.md for where they differ from the CPU
// kernels (no checks that would need to read device memory on the host).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cpu/attrs_digest_format.h"
#include "kernels/cpu/dtypes.h"
#include "kernels/cpu/export.h"
#include "kernels/cuda/cuda_util.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace kreg::kernels::cuda {

using Vector = ffi::Buffer<ffi::F32, 1>;

namespace {

// ---------------------------------------------------------------------------
// AddMul
// ---------------------------------------------------------------------------

__global__ void AddMulKernel(const float* a, const float* b, float* sum,
                             float* prod, size_t n) {
  KREG_GRID_STRIDE_LOOP(i, n) {
    const float va = a[i];
    const float vb = b[i];
    sum[i] = va + vb;
    prod[i] = va * vb;
  }
}

ffi::Error AddMulImpl(cudaStream_t stream, ffi::Buffer<ffi::F32> a,
                      ffi::Buffer<ffi::F32> b,
                      ffi::Result<ffi::Buffer<ffi::F32>> sum,
                      ffi::Result<ffi::Buffer<ffi::F32>> prod) {
  auto same = [](ffi::Span<const int64_t> p, ffi::Span<const int64_t> q) {
    return p.size() == q.size() && std::equal(p.begin(), p.end(), q.begin());
  };
  auto shape = [](ffi::Span<const int64_t> d) {
    return ShapeString(d.begin(), d.size());
  };
  if (!same(a.dimensions(), b.dimensions()) ||
      !same(a.dimensions(), sum->dimensions()) ||
      !same(a.dimensions(), prod->dimensions())) {
    return ffi::Error::InvalidArgument(
        "demo.AddMul: shapes differ: a " + shape(a.dimensions()) + ", b " +
        shape(b.dimensions()) + ", sum " + shape(sum->dimensions()) +
        ", prod " + shape(prod->dimensions()));
  }
  const size_t n = a.element_count();
  if (n == 0) return ffi::Error::Success();
  AddMulKernel<<<BlocksFor(n), kThreads, 0, stream>>>(
      a.typed_data(), b.typed_data(), sum->typed_data(), prod->typed_data(), n);
  return LastCudaError("demo.AddMul", "kernel launch");
}

// ---------------------------------------------------------------------------
// Fail
// ---------------------------------------------------------------------------

ffi::Error FailImpl(ffi::AnyBuffer, int64_t code) {
  return ffi::Error::InvalidArgument(
      "demo.Fail: refused on purpose (code=" + std::to_string(code) + ")");
}

// ---------------------------------------------------------------------------
// AttrsDigest: serialised on the host, copied to the device on the stream.
// ---------------------------------------------------------------------------

ffi::Error AttrsDigestImpl(cudaStream_t stream, ffi::RemainingArgs,
                           RawAttrs attrs,
                           ffi::Result<ffi::Buffer<ffi::U8>> out) {
  constexpr char kWho[] = "AttrsDigest";
  ffi::ErrorOr<std::string> text = AttrsDigestText(attrs.attrs);
  if (text.has_error()) return text.error();
  const std::string& digest = *text;
  const size_t capacity = out->element_count();
  if (digest.size() > capacity) {
    return ffi::Error::InvalidArgument(
        "AttrsDigest: output has " + std::to_string(capacity) +
        " bytes, the digest needs " + std::to_string(digest.size()));
  }
  uint8_t* dst = out->typed_data();
  if (!digest.empty()) {
    // From pageable memory: returns once `digest` has been staged, so it may
    // go out of scope right after.
    if (ffi::Error err =
            CudaCall(kWho, "cudaMemcpyAsync",
                     cudaMemcpyAsync(dst, digest.data(), digest.size(),
                                     cudaMemcpyHostToDevice, stream));
        err.failure()) {
      return err;
    }
  }
  if (capacity > digest.size()) {
    return CudaCall(kWho, "cudaMemsetAsync",
                    cudaMemsetAsync(dst + digest.size(), 0,
                                    capacity - digest.size(), stream));
  }
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------
// Accumulate / AccumulateInPlace: out[idx[i]] += 1 (atomics; repeats add up).
// Indices outside the state are skipped on the device: rejecting them, as the
// CPU kernel does, would need the indices on the host (a synchronisation).
// ---------------------------------------------------------------------------

__global__ void AddOnesKernel(const int32_t* idx, size_t count, float* out,
                              size_t n) {
  KREG_GRID_STRIDE_LOOP(i, count) {
    const int32_t j = idx[i];
    if (j >= 0 && static_cast<size_t>(j) < n) atomicAdd(out + j, 1.0f);
  }
}

ffi::Error CheckAccumulateSizes(const char* who,
                                const ffi::Buffer<ffi::F32>& state,
                                const ffi::Buffer<ffi::F32>& out) {
  if (out.element_count() != state.element_count()) {
    return ffi::Error::InvalidArgument(std::string(who) + ": output has " +
                                       std::to_string(out.element_count()) +
                                       " elements, state " +
                                       std::to_string(state.element_count()));
  }
  return ffi::Error::Success();
}

ffi::Error AddOnes(const char* who, cudaStream_t stream,
                   const ffi::Buffer<ffi::S32>& idx, float* out, size_t n) {
  const size_t count = idx.element_count();
  if (count == 0) return ffi::Error::Success();
  AddOnesKernel<<<BlocksFor(count), kThreads, 0, stream>>>(idx.typed_data(),
                                                           count, out, n);
  return LastCudaError(who, "kernel launch");
}

ffi::Error AccumulateImpl(cudaStream_t stream, ffi::Buffer<ffi::F32> state,
                          ffi::Buffer<ffi::S32> idx,
                          ffi::Result<ffi::Buffer<ffi::F32>> out) {
  constexpr char kWho[] = "demo.Accumulate";
  if (ffi::Error err = CheckAccumulateSizes(kWho, state, *out); err.failure()) {
    return err;
  }
  if (out->untyped_data() != state.untyped_data() && state.size_bytes() > 0) {
    if (ffi::Error err =
            CudaCall(kWho, "cudaMemcpyAsync",
                     cudaMemcpyAsync(out->untyped_data(), state.untyped_data(),
                                     state.size_bytes(),
                                     cudaMemcpyDeviceToDevice, stream));
        err.failure()) {
      return err;
    }
  }
  return AddOnes(kWho, stream, idx, out->typed_data(), state.element_count());
}

ffi::Error AccumulateInPlaceImpl(cudaStream_t stream,
                                 ffi::Buffer<ffi::F32> state,
                                 ffi::Buffer<ffi::S32> idx,
                                 ffi::Result<ffi::Buffer<ffi::F32>> out) {
  if (out->untyped_data() != state.untyped_data()) {
    return ffi::Error::InvalidArgument(
        "AccumulateInPlace: input and output are not the same buffer");
  }
  constexpr char kWho[] = "demo.AccumulateInPlace";
  if (ffi::Error err = CheckAccumulateSizes(kWho, state, *out); err.failure()) {
    return err;
  }
  return AddOnes(kWho, stream, idx, out->typed_data(), state.element_count());
}

// ---------------------------------------------------------------------------
// ScratchSum: kernel 1 writes the prefix sums into scratch memory, kernel 2
// reads them into y. ffi::ScratchAllocator frees the scratch when the handler
// returns, typically before either kernel has run: correct only because the
// host's allocator is ordered on this stream (XLA's is; kregd's frees with
// cuMemFreeAsync on the session stream).
// ---------------------------------------------------------------------------

// Sequential, so the float rounding is exactly that of np.cumsum.
__global__ void PrefixSumKernel(const float* x, float* prefix, size_t n) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  float acc = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    acc += x[i];
    prefix[i] = acc;
  }
}

__global__ void CopyKernel(const float* from, float* to, size_t n) {
  KREG_GRID_STRIDE_LOOP(i, n) { to[i] = from[i]; }
}

ffi::Error ScratchSumImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                          Vector x, ffi::Result<Vector> y) {
  constexpr char kWho[] = "demo.ScratchSum";
  const size_t n = x.element_count();
  if (y->element_count() != n) {
    return ffi::Error::InvalidArgument(std::string(kWho) + ": output has " +
                                       std::to_string(y->element_count()) +
                                       " elements, input " + std::to_string(n));
  }
  if (n == 0) return ffi::Error::Success();
  std::optional<void*> tmp = scratch.Allocate(n * sizeof(float), 64);
  if (!tmp.has_value() || *tmp == nullptr) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string(kWho) + ": scratch allocation of " +
                          std::to_string(n * sizeof(float)) +
                          " bytes failed (the host's "
                          "XLA_FFI_DeviceMemory_Allocate refused)");
  }
  float* prefix = static_cast<float*>(*tmp);
  PrefixSumKernel<<<1, 1, 0, stream>>>(x.typed_data(), prefix, n);
  if (ffi::Error err = LastCudaError(kWho, "kernel 1 launch"); err.failure()) {
    return err;
  }
  CopyKernel<<<BlocksFor(n), kThreads, 0, stream>>>(prefix, y->typed_data(), n);
  return LastCudaError(kWho, "kernel 2 launch");
}

}  // namespace
}  // namespace kreg::kernels::cuda

KREG_EXPORT_HANDLER(AddMul);
KREG_EXPORT_HANDLER(Fail);
KREG_EXPORT_HANDLER(AttrsDigest);
KREG_EXPORT_HANDLER(Accumulate);
KREG_EXPORT_HANDLER(AccumulateInPlace);
KREG_EXPORT_HANDLER(ScratchSum);

using kreg::kernels::RawAttrs;
using kreg::kernels::cuda::Vector;
using Stream = ffi::PlatformStream<cudaStream_t>;

XLA_FFI_DEFINE_HANDLER_SYMBOL(AddMul, kreg::kernels::cuda::AddMulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    Fail, kreg::kernels::cuda::FailImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Attr<int64_t>("code"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttrsDigest, kreg::kernels::cuda::AttrsDigestImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .RemainingArgs()
                                  .Attrs<RawAttrs>()
                                  .Ret<ffi::Buffer<ffi::U8>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(Accumulate, kreg::kernels::cuda::AccumulateImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AccumulateInPlace,
                              kreg::kernels::cuda::AccumulateInPlaceImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(ScratchSum, kreg::kernels::cuda::ScratchSumImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<Vector>()
                                  .Ret<Vector>());
