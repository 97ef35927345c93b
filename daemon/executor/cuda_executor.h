// The CUDA launches of a session (platform cuda): the session's CudaSession
// (stream, shared allocations, IPC events, doorbell, scratch), created on
// first use, and the launch sequence over it.
#ifndef KREGD_DAEMON_EXECUTOR_CUDA_EXECUTOR_H_
#define KREGD_DAEMON_EXECUTOR_CUDA_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "daemon/executor/launch_executor.h"

namespace kreg {

class CudaDevices;
class CudaSession;

class CudaExecutor final : public LaunchExecutor {
 public:
  // ctx.cuda null: kregd was started without CUDA (every request is
  // UNIMPLEMENTED, saying so).
  explicit CudaExecutor(const SessionContext& ctx);
  ~CudaExecutor() override;

  // Finds the device by the header's UUID; from the socket, applies the
  // releases, events and shares of the request's side data (its fds from
  // the request's), then Run. Off the launch ring (steady state: no shares,
  // events or releases), whatever fails after the device is found,
  // done := doorbell_seq is still enqueued when possible
  // (CudaSession::SignalDoorbell), so an XLA stream that already waits for
  // it (asynchronous mode) moves on; ring::kDoneSignalled says whether it
  // was, and an asynchronous launch whose doorbell could not be signalled
  // ends the session.
  absl::Status Launch(Request* request) override;
  // CudaShare and CudaDoorbellSetup (ShareCuda, SetDoorbell).
  bool HandleRequest(const v1::SessionRequest& request,
                     std::vector<UniqueFd>* fds, v1::SessionResponse* resp,
                     absl::Status* status) override;
  void DescribeTo(v1::HelloReply* reply) const override;
  void Release() override;

 private:
  // What a CUDA launch tells the client besides its status (LaunchReply's
  // fields; a ring completion's flags).
  struct Outcome {
    bool mapping_missing = false;  // a buffer's allocation is not held
    bool signalled = false;        // done := doorbell_seq was enqueued
  };

  // A socket launch's releases, events and shares (`socket`'s fds).
  absl::Status ApplySideData(CudaSession* cuda, SocketPart* socket);
  // CudaDoorbellSetup with its one VMM fd.
  absl::Status SetDoorbell(const v1::CudaDoorbellSetup& setup,
                           std::vector<UniqueFd> fds);
  // Imports `shares`, taking their fds from the front of `fds`.
  absl::Status ShareCuda(
      const google::protobuf::RepeatedPtrField<v1::CudaShare>& shares,
      std::vector<UniqueFd>* fds);
  // The session's CudaSession (created on first use); null without devices.
  CudaSession* Cuda();
  // The session's CudaSession and kregd's ordinal of the client's device
  // `device_uuid`; UNIMPLEMENTED without devices, FindByUuid's errors.
  absl::StatusOr<int> Device(absl::string_view target,
                             absl::string_view device_uuid, CudaSession** cuda);
  // The part of a launch the socket and the ring share: resolves every
  // buffer through the session's mapping cache (limit on distinct
  // allocations, device check), decodes through `decode` (given that
  // resolver), looks the handler up and runs it on the session stream
  // (CudaSession::Launch).
  absl::Status Run(uint64_t request_id, CudaSession* cuda, int ordinal,
                   absl::string_view device_uuid, uint64_t doorbell_seq,
                   const RingDecode& decode, Outcome* out);

  const SessionContext ctx_;
  CudaDevices* const devices_;
  // The call frame of the last launch, reused while its attributes are
  // unchanged (as the CPU executor does; charged to ctx.budget).
  CallFrameCache frames_;
  std::unique_ptr<CudaSession> cuda_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_CUDA_EXECUTOR_H_
