// The KREG_TRACE_CUDA trace of forwarded CUDA calls (cuda_forward.cc).
// Internal to //client/shim.
#ifndef KREGD_CLIENT_SHIM_CUDA_TRACE_H_
#define KREGD_CLIENT_SHIM_CUDA_TRACE_H_

namespace kreg {
namespace shim {

// KREG_TRACE_CUDA=1 (stderr) or =PATH (appended): one line per step of each
// forwarded CUDA call, flushed at once, so the last line before a crash says
// how far a call got.
__attribute__((format(printf, 1, 2))) void Trace(const char* fmt, ...);

// Whether KREG_TRACE_CUDA is set (Trace writes anything).
bool Tracing();

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_CUDA_TRACE_H_
