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
#include "common/ring_encode.h"
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
  std::vector<Buf> bufs;  // args first, then rets
  const std::string* target = nullptr;
  // What the forwarder describes of the launch: target, platform, attribute
  // bytes (AttrCache's), run id and device ordinal, device_uuid (= uuid).
  // LaunchOnConn adds the buffers (per attempt: where each one lives).
  ring::DescriptorView launch;
};

// Runs the launch of `call` on `conn`, sharing or staging its buffers and
// ordering it between XLA's preceding and later work. In steps over one
// attempt: plan (shared, cached or staged), stage (copies into the staging
// buffer), bound the cache, describe (the buffers' views: a descriptor on
// the launch ring for a steady-state launch ordered by the doorbell, else
// the same descriptor in the socket Launch in `req` with its shares,
// releases and events: the only protobuf a launch builds), order and send,
// complete (await kregd unless asynchronous, order XLA's stream after the
// handler, commit the cache and copy staged results back). Retried once, on the
// socket, when kregd no longer holds a mapping this session's cache says it
// shared. An earlier asynchronous launch's error (KREG_ASYNC_LAUNCH=1) is
// returned first and this launch is not run. `req` and `resp` are scratch.
ClientStatus LaunchOnConn(Conn* conn, Call* call, v1::SessionRequest* req,
                          v1::SessionResponse* resp);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_CUDA_LAUNCH_H_
