// Stage stamps of one traced ring launch (KREG_TRACE_STAGES=1; bench/
// prints the breakdown, DESIGN §9). A thread that runs a traced launch
// sets Current() to its Times; Mark() is a no-op (one call, one load)
// otherwise. The thread-local lives in stage_trace.cc with internal linkage,
// so the client shim exports no symbol for it.
// Both the shim and kregd-exec use it; the executor's stamps travel back in
// the completion's ring::StageTrailer.
#ifndef KREGD_COMMON_STAGE_TRACE_H_
#define KREGD_COMMON_STAGE_TRACE_H_

#include <cstdint>

#include "common/ring_layout.h"

namespace kreg {
namespace stage {

// In call order. kEnter..kPublished and kWoke, kReturned: the client;
// kPicked..kCompleted: the executor.
enum Point : int {
  kEnter = 0,     // the forwarding handler was called by XLA
  kPrepared,      // the descriptor's inputs are ready (CPU: arena copies)
  kPublished,     // the descriptor is published on the ring
  kPicked,        // the executor's ring thread took it
  kDecoded,       // validated and decoded
  kHandlerStart,  // the call frame is built; the handler starts
  kHandlerEnd,    // the handler returned
  kCompleted,     // just before the completion is published
  kWoke,          // the client saw the completion
  kReturned,      // the forwarding handler returns to XLA
  kPoints
};

struct Times {
  int64_t ns[kPoints];
};

// The Times of the launch this thread traces, or null (almost always).
Times* Current();
void SetCurrent(Times* times);

inline void Mark(Point p) {
  if (Times* t = Current(); t != nullptr) t->ns[p] = ring::NowNs();
}

}  // namespace stage
}  // namespace kreg

#endif  // KREGD_COMMON_STAGE_TRACE_H_
