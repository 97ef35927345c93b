// The CUDA launches of a session (platform cuda): the session's CudaSession
// (stream, shared allocations, IPC events, doorbell, scratch), created on
// first use, and the launch sequence over it.
#ifndef KREGD_DAEMON_SESSION_CUDA_EXECUTOR_H_
#define KREGD_DAEMON_SESSION_CUDA_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "daemon/session/launch_executor.h"

namespace kreg {

class CudaDevices;
class CudaSession;

class CudaExecutor final : public LaunchExecutor {
 public:
  // `devices` null: kregd was started without CUDA (every request is
  // UNIMPLEMENTED, saying so).
  CudaExecutor(const SessionContext& ctx, CudaDevices* devices);
  ~CudaExecutor() override;

  absl::Status Launch(uint64_t request_id, const v1::Launch& launch,
                      std::vector<UniqueFd> fds,
                      v1::LaunchReply* reply) override;
  void DescribeTo(v1::HelloReply* reply) const override;
  void Release() override;

  // CudaShareRequest: imports `shares`, one VMM fd each from `fds` in
  // order; INVALID_ARGUMENT when fds are left over.
  absl::Status Share(
      const google::protobuf::RepeatedPtrField<v1::CudaShare>& shares,
      std::vector<UniqueFd> fds);
  // CudaDoorbellSetup with its one VMM fd.
  absl::Status SetDoorbell(const v1::CudaDoorbellSetup& setup,
                           std::vector<UniqueFd> fds);

 private:
  // Imports `shares`, taking their fds from the front of `fds`.
  absl::Status ShareCuda(
      const google::protobuf::RepeatedPtrField<v1::CudaShare>& shares,
      std::vector<UniqueFd>* fds);
  // The session's CudaSession (created on first use); null without devices.
  CudaSession* Cuda();

  const SessionContext ctx_;
  CudaDevices* const devices_;
  std::unique_ptr<CudaSession> cuda_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SESSION_CUDA_EXECUTOR_H_
