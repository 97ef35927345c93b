// kreg::Client: the C++ client of kregd's gRPC API (used by kregctl and the
// integration tests). Not thread-safe per instance; cheap to create.
#ifndef KREGD_CLIENT_CLIENT_H_
#define KREGD_CLIENT_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kreg/v1/cluster.grpc.pb.h"
#include "kreg/v1/registry.grpc.pb.h"
#include "kreg/v1/supervision.grpc.pb.h"

namespace kreg {

struct RegisterRequest {
  std::string target_name;
  // The execute function, or empty when `stages` names it.
  std::string func_name;
  // A handler bundle (docs/kernel-author-guide.md, "Handler bundles and
  // state"): (stage, symbol) pairs and the state type (name, TypeId symbol,
  // TypeInfo symbol; empty name: none). kregd checks them.
  std::vector<std::pair<std::string, std::string>> stages;
  std::string state_type_name, state_type_id_symbol, state_type_info_symbol;
  std::string platform = "cpu";
  std::string content_id;
  bool replace = false;
  // An in-process callable (content_id required, no module).
  bool in_process = false;
  // Exactly one of: bytes to upload, or a path the daemon reads itself.
  std::string module_bytes;
  std::string daemon_path;
  // Optional: the uploaded module's file name, for the daemon's messages.
  std::string module_file_name;
  // Called after each uploaded chunk with (bytes sent, total); may be empty.
  std::function<void(uint64_t, uint64_t)> progress;
};

// A refusal's structured detail, when the daemon sent one.
struct RegisterError {
  absl::Status status;
  bool has_detail = false;
  v1::KernelRegistrationError detail;
};

class Client {
 public:
  // Does not connect yet; the first call does.
  explicit Client(const std::string& socket_path);
  // Over an existing channel (e.g. from a connected socket fd); `name` is
  // what error messages call it.
  Client(std::shared_ptr<grpc::Channel> channel, const std::string& name);

  // UNAVAILABLE (naming the socket and how to start kregd) when the daemon
  // cannot be reached; otherwise the daemon's status and message unchanged.
  absl::StatusOr<v1::RegisterTargetResponse> Register(
      const RegisterRequest& req, RegisterError* error = nullptr);
  absl::StatusOr<std::vector<v1::Target>> List();
  absl::StatusOr<std::vector<v1::Target>> Get(const std::string& name,
                                              const std::string& platform);
  absl::StatusOr<v1::GetStatusResponse> Status();
  // The live client sessions.
  absl::StatusOr<v1::ListSessionsResponse> Sessions();
  // kregd's effective configuration and each value's origin.
  absl::StatusOr<v1::GetConfigResponse> Config();
  // Retires `name` on `platform` (every platform when empty); returns the
  // retired entries.
  absl::StatusOr<std::vector<v1::Target>> Retire(const std::string& name,
                                                 const std::string& platform);
  // Reserves names, lifts a reservation, or (empty pattern) only lists.
  absl::StatusOr<v1::ReserveNamesResponse> ReserveNames(
      const v1::ReserveNamesRequest& req);
  absl::StatusOr<v1::CollectGarbageResponse> CollectGarbage();
  // OK when the standard health service says SERVING.
  absl::Status Health();
  // Executor crash counts and quarantine (kreg.v1.Supervision).
  absl::StatusOr<v1::ListCrashesResponse> Crashes(const std::string& name);
  // Cluster mode: every binding in etcd, and the kregd hosts advertised.
  // FAILED_PRECONDITION from a standalone kregd.
  absl::StatusOr<v1::ListClusterTargetsResponse> ClusterTargets();
  absl::StatusOr<v1::ListHostsResponse> Hosts();
  absl::StatusOr<v1::UnquarantineResponse> Unquarantine(
      const v1::UnquarantineRequest& req);
  // Compiles and registers (DESIGN §13). The compiler's diagnostics go to
  // `on_diagnostics` as they arrive; a failed compile's status carries them
  // too. Waits up to `timeout_s`.
  absl::StatusOr<v1::CompileTargetResult> Compile(
      const v1::CompileTargetRequest& req, double timeout_s,
      const std::function<void(const std::string&)>& on_diagnostics);

 private:
  absl::Status FromGrpc(const grpc::Status& s) const;
  // One unary call of `method` on `stub` (120 s deadline).
  template <typename Stub, typename Req, typename Resp>
  absl::StatusOr<Resp> Unary(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                          const Req&, Resp*),
                             Stub& stub, const Req& req);

  const std::string socket_path_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Registry::Stub> stub_;
};

}  // namespace kreg

#endif  // KREGD_CLIENT_CLIENT_H_
