// One forwarded CUDA launch on a session (cuda_forward.cc): the staging of
// buffers that cannot be shared, the ordering of XLA's stream and kregd's
// session stream (doorbell or interprocess events) and the Launch request.
// Internal to //client/shim.
#ifndef KREGD_CLIENT_SHIM_CUDA_LAUNCH_H_
#define KREGD_CLIENT_SHIM_CUDA_LAUNCH_H_

#include <string>
#include <vector>

#include "client/shim/conn.h"
#include "client/shim/cuda_conn_state.h"
#include "common/cuda_driver.h"
#include "common/status.h"
#include "kreg/v1/session.pb.h"

namespace kreg {
namespace shim {

struct Call {
  const cu::CudaDriver* d;
  cu::CUstream stream;
  cu::CUcontext ctx;
  int ordinal;
  std::string uuid;
  std::vector<Buf> bufs;
};

// Sends the Launch in `req` (its buffers, attributes and context already
// encoded) for `call` on `conn`, sharing or staging its buffers and ordering
// it between XLA's preceding and later work; retried once when kregd no
// longer holds a mapping this session's cache says it shared.
ClientStatus LaunchOnConn(Conn* conn, Call* call, v1::SessionRequest* req,
                          v1::SessionResponse* resp);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_CUDA_LAUNCH_H_
