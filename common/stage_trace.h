// Stage stamps of one traced ring launch (KREG_TRACE_STAGES=1; bench/
// prints the breakdown, DESIGN §9). A thread that runs a traced launch
// points t_stage at its Times; Mark() is a no-op (one load) otherwise.
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

extern thread_local Times* t_stage;

inline void Mark(Point p) {
  if (t_stage != nullptr) t_stage->ns[p] = ring::NowNs();
}

}  // namespace stage
}  // namespace kreg

#endif  // KREGD_COMMON_STAGE_TRACE_H_
