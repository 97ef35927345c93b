// The shim's connection to one kregd: a pool of sessions, the registrations
// this process made (replayed after a daemon restart) and counters.
#ifndef KREGD_CLIENT_SHIM_CLIENT_H_
#define KREGD_CLIENT_SHIM_CLIENT_H_

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/shim/conn.h"
#include "common/ring_encode.h"
#include "common/status.h"
#include "kreg/v1/session.pb.h"

namespace kreg {
namespace shim {

// A registration as the shim sends it (and replays after a reconnect): the
// header (registration.proto) and, for an upload (module.upload_size), the
// module's bytes.
struct Registration {
  v1::RegisterTargetHeader header;
  std::string module;
};

// Sends `registration` over `conn` and fills `response` (its
// register_target); an upload's bytes travel as a sealed memfd
// (module_upload.cc) and module.upload_size is set to their count, so the
// one limit is kregd's max_module_bytes on every path: an upload larger
// than `max_module_bytes` is INVALID_ARGUMENT before anything is sent (both
// sizes in the message). Errors as Conn::Call.
ClientStatus CallRegister(Conn* conn, const Registration& registration,
                          uint64_t max_module_bytes,
                          v1::SessionResponse* response);

// Thread-safe. Ping, registrations and listings go on the control
// connection, which kregd serves itself and which holds this process's
// registrations while it is open (opened on first use, kept for the process
// lifetime). Every other operation borrows one session exclusively (opened
// when none is idle: kregd hands it to an executor); up to
// max_sessions run at once (one daemon thread each). When a session or the
// control connection breaks (the daemon went away), the next operation
// opens a fresh one (a fresh control connection first re-registers every
// target this process registered: idempotent in the daemon) and retries
// the operation, up to 6 tries in all (kregd may restart again meanwhile).
class Client {
 public:
  explicit Client(std::string session_path);
  // Stops the idle watch (if this process started it).
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Process-wide client for `session_path` (created on first use, never
  // destroyed: forwarding handlers keep using it).
  static Client* ForPath(const std::string& session_path);

  // Checks that kregd answers and speaks this library's protocol major on
  // the control connection (opened, or reopened, first): starts no
  // executor.
  ClientStatus Ping();
  ClientStatus Register(const Registration& registration,
                        v1::RegisterTargetResponse* out);
  ClientStatus List(v1::ListTargetsResponse* out);
  // Asks kregd for the module of (target, platform) for local execution
  // (BindLocal): its entry in `*out` and the sealed memfd in `*module`,
  // unchecked (local_bind.cc checks and loads it); `generation` > 0 asks
  // for that generation (a pin, docs/replace.md §7). The hold (and its
  // generation) is re-recorded on the fresh session after a reconnect.
  ClientStatus BindLocal(const std::string& target, const std::string& platform,
                         uint32_t generation, v1::BindLocalReply* out,
                         UniqueFd* module);
  // Whether a launch whose session ended while it was in flight may run
  // again on a fresh session (DESIGN §12): only when that cannot change a
  // result. CPU outputs are copied back only on success, so a CPU launch
  // always may; a CUDA launch writes its outputs in place and may only
  // when no output overlaps an input.
  struct Rerun {
    std::string target;
    bool outputs_alias_inputs = false;
  };
  // Runs `op` on a borrowed session; retried once on a fresh session if the
  // session broke during `op` (kregd went away, or an executor crash
  // caused by another session interrupted it: ABORTED). For a launch
  // (`rerun` set) that had left when the session broke, the retry follows
  // `rerun` and is said once per process on stderr.
  ClientStatus WithConn(const std::function<ClientStatus(Conn*)>& op,
                        const Rerun* rerun = nullptr);

  // A handler bundle's instantiate stage for one call site (session.proto
  // Instantiate; `d` has no buffers): kregd's executor runs it and keeps
  // the state for this process under `*handle`. The executor's or the
  // handler's error verbatim.
  ClientStatus Instantiate(const ring::DescriptorView& d, uint64_t* handle);
  // A handler bundle's prepare or initialize stage (`stage`, XLA's
  // numbering) for one execution of a call site (session.proto StageCall;
  // `d`'s buffers carry shapes only): kregd's executor runs it with the
  // call site's state, after the session's asynchronous launches ran. The
  // executor's or the handler's error verbatim.
  ClientStatus StageCall(const ring::DescriptorView& d, uint32_t stage);
  // Releases the executor's state `handle` (XLA destroyed the call site's
  // executable) on an idle session, or, when every session is busy, on the
  // next one borrowed (at most kMaxPendingReleases wait). Nothing is opened
  // or waited for (XLA may destroy executables at process exit); a session
  // that ended released its states already.
  void ReleaseState(uint64_t handle);
  static constexpr size_t kMaxPendingReleases = 4096;
  // GPU work of an earlier forwarded call that never completed (its
  // executor died after the handler returned, e.g. a kernel faulted on the
  // GPU): the error, once, for the next forwarded call to return; OK when
  // there is none.
  ClientStatus TakeLostWork();

  const std::string& path() const { return path_; }
  uint64_t reconnects() const { return reconnects_.load(); }
  uint64_t open_sessions();
  std::atomic<uint64_t> launches{0};
  std::atomic<uint64_t> launch_errors{0};

 private:
  ClientStatus Acquire(std::unique_ptr<Conn>* out);
  // Opens a session; once this Client has had one, a kregd that does not
  // answer (restarting) is retried with backoff for up to
  // $KREG_RECONNECT_TIMEOUT seconds (default 30; 0: no retry), said once
  // on stderr.
  ClientStatus OpenSession(std::unique_ptr<Conn>* out, bool control = false);
  // Runs `op` on the control connection (opened, or reopened when kregd
  // closed it, first); retried on a reopened one when it broke during
  // `op`, up to 6 tries in all.
  ClientStatus WithControl(const std::function<ClientStatus(Conn*)>& op);
  // control_ is open to the kregd now serving (a new one is opened, and
  // this process's registrations made again on it, otherwise).
  ClientStatus FreshControlLocked();  // control_mu_ held
  void Release(std::unique_ptr<Conn> conn);
  // Sends the ReleaseStates that waited for a session (ReleaseState).
  void SendPendingReleases(Conn* conn);
  void Discard(std::unique_ptr<Conn> conn);
  ClientStatus Replay(Conn* conn);
  // The session of `conn` ended (Conn::ended()): releases the doorbell
  // waits its executor will never answer. When GPU work was lost, the
  // error to report (naming the device and `why`, kregd's word), also
  // kept for TakeLostWork (before the wait is released) when `keep`; else
  // OK.
  ClientStatus Abandon(Conn* conn, const ClientStatus& why, bool keep);
  // Keeps a lost-work error (if not OK and none is kept) for TakeLostWork.
  void KeepLostWork(ClientStatus lost);
  // The idle watch: idle sessions whose GPU work an XLA stream may still
  // wait on are polled; one whose socket reports the end of the session
  // (its executor died while the process waited on the GPU) is taken out
  // of the pool and abandoned, so the stream cannot wait forever.
  void StartWatchLocked();  // mu_ held
  void WatchLoop();

  const std::string path_;
  const int max_sessions_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Conn>> idle_;  // guarded by mu_
  int open_ = 0;                             // guarded by mu_
  uint64_t epoch_ = 0;           // guarded by mu_; bumped when a session breaks
  uint64_t replayed_epoch_ = 0;  // guarded by mu_
  pid_t pid_;                    // guarded by mu_; reset after fork
  // (target, canonical platform) -> registration; guarded by reg_mu_.
  std::mutex reg_mu_;
  std::map<std::pair<std::string, std::string>, Registration> registrations_;
  // (target, canonical platform) held locally; guarded by reg_mu_.
  // (target, canonical platform) -> the generation it pinned (0: none).
  std::map<std::pair<std::string, std::string>, uint32_t> local_holds_;
  std::atomic<uint64_t> reconnects_{0};
  // kregd's max_module_bytes, from the last HelloReply (the control
  // connection's comes before any registration).
  std::atomic<uint64_t> max_module_bytes_{0};
  std::mutex control_mu_;
  std::unique_ptr<Conn> control_;  // guarded by control_mu_
  pid_t control_pid_ = 0;          // guarded by control_mu_
  std::atomic<bool> ever_connected_{false};
  std::atomic<bool> said_waiting_{false};
  std::condition_variable watch_cv_;
  std::thread watch_;        // guarded by mu_
  pid_t watch_pid_ = 0;      // guarded by mu_: the process that started it
  bool stop_watch_ = false;  // guarded by mu_
  // Written under mu_; read without it first (the launch path).
  std::atomic<bool> has_lost_work_{false};
  std::vector<uint64_t> pending_releases_;  // guarded by mu_
  std::atomic<bool> has_pending_releases_{false};
  ClientStatus lost_work_;  // guarded by mu_
};

// "cpu" for cpu/host, "cuda" for cuda/gpu (any case); other values as
// given, lower-cased (the daemon refuses them).
std::string CanonicalPlatform(const std::string& platform);

// Pinning a generation (docs/replace.md §7). OK when kregd (`client`'s
// listing) has generation `generation` of (target, canonical platform);
// NOT_FOUND listing those it has otherwise (common/generations.h).
ClientStatus CheckGeneration(Client* client, const std::string& target,
                             const std::string& platform, uint32_t generation);
// FAILED_PRECONDITION: (target, canonical platform) is bound in this process
// at generation `bound` (0: following the current one), so it cannot be
// bound at `wanted` too.
ClientStatus OtherGeneration(const std::string& target,
                             const std::string& platform, uint32_t bound,
                             uint32_t wanted);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_CLIENT_H_
