// One session of the shim with kregd: a connected socket and the client's
// side of the session arena.
#ifndef KREGD_CLIENT_SHIM_CONN_H_
#define KREGD_CLIENT_SHIM_CONN_H_

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/ring_encode.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "kreg/v1/session.pb.h"

namespace kreg {
namespace shim {

class ClientRing;
class CudaConnState;

// Not thread-safe: a Conn is used by one thread at a time (the Client's pool
// hands it out exclusively). Closes the socket and unmaps the arena on
// destruction, which ends the session in the daemon.
class Conn {
 public:
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Connects to `path` and says Hello. UNAVAILABLE with the path and reason
  // when nothing listens there; the daemon's error otherwise. With
  // `control`, says it as control_hello: a control connection, whose
  // requests (RegisterTarget, List) kregd serves itself and whose
  // HelloReply carries only kregd's version and max_module_bytes
  // (DESIGN §3).
  static ClientStatus Open(const std::string& path, std::unique_ptr<Conn>* out,
                           bool control = false);

  // Sends `request` (its id is set here) with `fds` attached and waits for
  // the matching response (asynchronous ring launches in flight complete
  // first: the socket never overtakes the ring; their errors are kept). A
  // transport failure returns UNAVAILABLE and marks the Conn broken; the
  // daemon's error status is returned as is.
  // `received`, when given, gets the first fd attached to the response
  // (BindLocal's module); other attached fds are closed.
  ClientStatus Call(v1::SessionRequest* request, v1::SessionResponse* response,
                    const int* fds = nullptr, int num_fds = 0,
                    UniqueFd* received = nullptr);

  // Runs a CPU launch: its descriptor goes on the session's launch ring
  // when kregd serves one and it fits a slot (encoded straight into the
  // ring: no protobuf), else in a Launch request by Call(), built in
  // `request` and answered in `response` (scratch the caller reuses). Errors as
  // Call(); on the ring, a session kregd ended while this call waited (its
  // executor died) is noticed on the socket within $KREG_RING_SLICE_MS
  // (default 10 ms) and reported as Call() would. Asynchronous CUDA launches
  // in flight complete first; an error of one is returned instead (this
  // launch is not run).
  ClientStatus LaunchCpu(const ring::DescriptorView& launch,
                         v1::SessionRequest* request,
                         v1::SessionResponse* response);
  // The launch ring is in use (HelloReply.launch_ring and RingSetup).
  bool ring() const { return ring_ != nullptr; }

  // CUDA launches on the ring (cuda_launch.cc). Publishes `launch` (a
  // steady-state CUDA descriptor); false when there is no ring or it does
  // not fit a slot (nothing published: use the socket). Synchronous
  // (`async` false): every asynchronous launch in flight has completed
  // first; the caller then calls AwaitRing(). Asynchronous: the caller does
  // not wait; its completion is consumed later (ReapAsync) and an error is
  // kept for the session's next call (TakeAsyncError), naming `target`. A
  // full ring first waits for the oldest completion. Errors only when the
  // session broke meanwhile (Call()'s).
  ClientStatus SubmitRing(const ring::DescriptorView& launch, bool async,
                          const std::string& target, bool* submitted);
  // Waits for the completion of the synchronous ring launch submitted last:
  // its status, and its flags (ring::kDoneSignalled, ring::kMappingMissing)
  // in `*flags`. A session kregd ended meanwhile is reported as LaunchCpu
  // does.
  ClientStatus AwaitRing(uint32_t* flags);
  // Consumes the completions of asynchronous launches: those already there
  // (`all` false) or every one in flight (`all` true, waiting). The first
  // error is kept for TakeAsyncError; a kMappingMissing one also clears
  // the session's CUDA cache (the next call shares again). Errors only for
  // a broken session.
  ClientStatus ReapAsync(bool all);
  // The kept error of an earlier asynchronous launch (once), else OK.
  ClientStatus TakeAsyncError();
  // Asynchronous launches whose completion was not consumed yet.
  size_t async_in_flight() const { return async_targets_.size(); }

  // Makes the arena at least `bytes` long (replacing it with a new sealed
  // memfd). RESOURCE_EXHAUSTED above the daemon's max_arena_bytes.
  ClientStatus EnsureArena(uint64_t bytes);

  char* arena() const { return arena_; }
  uint64_t arena_size() const { return arena_size_; }
  bool broken() const { return broken_; }
  // The peer ended the session: the socket reached its end, or kregd sent
  // its connection-level error (refused()). Unlike other transport errors
  // this means the executor serves the session no more (it died, or its
  // sessions were ended), so nothing of it runs later.
  bool ended() const { return ended_; }
  // The session socket (for a poll by the Client's idle watch).
  int fd() const { return sock_; }
  // An idle session's socket became readable: reads what arrived — kregd's
  // connection-level error (an id-0 response: its executor died) or the
  // end of the session — marks the Conn broken and ended, and returns that
  // error (UNAVAILABLE "... ended" for a plain end of the session).
  ClientStatus ReadEnd() { return Unsolicited(/*idle=*/true); }
  // kregd ended the session with an error of its own (a response with id
  // 0: its executor crashed while running this call, a session limit): the
  // call must not be retried on a fresh session.
  bool refused() const { return refused_; }
  // A launch left for kregd or the executor (socket or ring) since
  // ClearLaunchSent(): a session that broke after that may have run part
  // of the call.
  bool launch_sent() const { return launch_sent_; }
  void ClearLaunchSent() { launch_sent_ = false; }
  // kregd's HelloReply (its limits, GPUs, doorbell; empty for a control
  // connection).
  const v1::HelloReply& hello() const { return hello_; }
  // The session protocol minor this session speaks: the lower of kregd's
  // and this library's (NegotiateSessionProtocol); a feature of a later
  // minor is used only when this is at least that minor.
  uint32_t protocol_minor() const { return protocol_minor_; }

  // The session's CUDA state (cuda_forward.cc), created on its first CUDA
  // call; owned by the Conn.
  CudaConnState* cuda_state = nullptr;

  // Bookkeeping of the owning Client.
  uint64_t epoch = 0;
  pid_t pid = 0;

 private:
  Conn(int sock, std::string path);
  ClientStatus Transport(const std::string& what, int result);
  // Sets up the launch ring; false (socket launches) when kregd refused it.
  ClientStatus SetUpRing();
  // What arrived on the socket while a ring launch waited (or, `idle`, on
  // an idle session): kregd's connection-level error, or the end of the
  // session.
  ClientStatus Unsolicited(bool idle);
  // Waits for the oldest ring completion (watching the socket while it
  // sleeps). Errors only for a session that ended or broke.
  ClientStatus AwaitOne(int* code, std::string* message, uint32_t* flags);
  // Consumes the oldest asynchronous completion (waiting for it), keeping
  // its error.
  ClientStatus ReapOne();

  const std::string path_;
  int sock_;
  bool broken_ = false;
  bool refused_ = false;
  bool ended_ = false;
  bool launch_sent_ = false;
  uint64_t next_id_ = 1;
  v1::HelloReply hello_;
  uint32_t protocol_minor_ = 0;
  char* arena_ = nullptr;
  uint64_t arena_size_ = 0;
  std::string out_buf_;
  std::string in_buf_;
  std::unique_ptr<ClientRing> ring_;
  std::string ring_message_;
  // Targets of the asynchronous launches in flight, oldest first.
  std::deque<std::string> async_targets_;
  ClientStatus async_error_;
};

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_CONN_H_
