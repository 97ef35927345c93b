// kregd-exec: runs registered kernels for the client sessions kregd hands
// it (DESIGN §8). Started by kregd only (posix_spawn): fd 3 is its control
// socket, fd 4 its status page. It drops to the credentials kregd names,
// hardens itself, then serves each adopted session on its own thread until
// kregd closes the control socket.
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/ring_layout.h"
#include "common/wire.h"
#include "daemon/base/adoption.h"
#include "daemon/base/hardening.h"
#include "daemon/base/log_format.h"
#include "daemon/base/served_session.h"
#include "daemon/base/status_page.h"
#include "daemon/executor/cuda/cuda_devices.h"
#include "daemon/executor/executor_backend.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "daemon/executor/module_cache.h"
#include "daemon/executor/repoint_apply.h"
#include "daemon/executor/repoint_table.h"
#include "daemon/executor/session.h"
#include "kreg/v1/executor.pb.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

constexpr int kControlFd = 3;
constexpr int kStatusFd = 4;
// The executor leaves because of a sticky CUDA error (its contexts are
// corrupt): after a handler call saw it (its sessions end first), or at
// once when the sticky-error watch found it (the status page says which).
constexpr int kExitRecycle = 75;
// How often the sticky-error watch asks the driver (cuStreamQuery: no GPU
// work, no context switch).
constexpr int kGpuWatchMs = 50;

StatusPage* g_page = nullptr;

// A kernel that faults on the GPU after its handler returned (the launch
// was acknowledged) leaves no host thread waiting: every session's GPU
// work on that context is gone, and the clients' streams wait on doorbells
// nobody will write. The watch asks the driver every kGpuWatchMs; on a
// sticky error it leaves the last words and exits at once, so that kregd
// answers each session (naming the target of its last CUDA launch and the
// CUDA error) and the clients release their streams (DESIGN §8).
void WatchGpu(CudaDevices* cuda, StatusPage* page, std::atomic<bool>* recycle,
              const std::atomic<bool>* stop) {
  while (!stop->load()) {
    struct timespec ts = {0, kGpuWatchMs * 1000000L};
    nanosleep(&ts, nullptr);
    // A handler call saw it first: its reply carries the error and the
    // executor ends its sessions.
    if (recycle->load()) return;
    cu::CUresult r = cu::CUDA_SUCCESS;
    int ordinal = 0;
    absl::Status s = cuda->PollSticky(&r, &ordinal);
    if (s.ok()) continue;
    // Claim the exit (a handler call may see the error at the same time;
    // then its path ends the sessions). `recycle` stays unset: the main
    // loop must not end the sessions as if they had ended cleanly.
    uint32_t none = 0;
    if (!page->header()->recycle.compare_exchange_strong(none, 2)) return;
    WriteNote(page, absl::StrCat("GPU fault after the handler returned: ",
                                 cu::DescribeCuResult(*cuda->driver(), r),
                                 ", on ", cuda->info(ordinal).uuid_text,
                                 "; the executor's CUDA context is corrupt"));
    spdlog::error("{}; exiting so that kregd fails the calls in flight",
                  std::string(s.message()));
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    page->header()->exit_status.store(kExitKnown | (kExitRecycle << 8));
    ::_exit(kExitRecycle);
  }
}

// std::terminate (an uncaught C++ exception, e.g. thrown by a handler):
// leave the exception's text where kregd reads it, then abort.
void OnTerminate() {
  std::string what = "uncaught C++ exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = absl::StrCat("uncaught C++ exception: ", x.what());
    } catch (...) {
      what = "uncaught C++ exception of a non-std type";
    }
  }
  if (g_page != nullptr) WriteNote(g_page, what);
  std::abort();
}

// A fatal signal on a thread that runs a session's handler: record the
// slot in the status page (kregd blames that session's target alone, not
// every session whose handler was running at the time), then die of the
// same signal (SA_RESETHAND restored the default action; the raised signal
// is delivered when the handler returns). Only async-signal-safe work.
void OnFatalSignal(int sig) {
  const int32_t slot = RunningSlotOfThisThread();
  if (g_page != nullptr && slot >= 0) {
    uint32_t none = 0;
    g_page->header()->faulted_slot.compare_exchange_strong(
        none, static_cast<uint32_t>(slot) + 1);
  }
  if (g_page != nullptr) {
    uint32_t none = 0;
    g_page->header()->exit_status.compare_exchange_strong(
        none, kExitKnown | static_cast<uint32_t>(sig));
  }
  ::raise(sig);
}

void RecordFatalSignals() {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnFatalSignal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) {
    ::sigaction(sig, &sa, nullptr);
  }
}

bool SendMessage(int fd, const google::protobuf::MessageLite& m,
                 const std::vector<int>& fds) {
  return wire::SendMessage(fd, m, fds.data(), static_cast<int>(fds.size())) ==
         wire::kOk;
}

void Reply(const absl::Status& status, const v1::ExecInitReply& base) {
  v1::ExecInitReply reply = base;
  ToWireStatus(status, reply.mutable_status());
  SendMessage(kControlFd, reply, {});
}

struct Served {
  std::shared_ptr<Session> session;
  // Alive until the session told kregd it ended.
  std::weak_ptr<ExecutorBackend> backend;
  int client_fd = -1;  // owned by `session`
  uint64_t session_id = 0;
  uint32_t slot = 0;
  std::thread thread;
  std::shared_ptr<std::atomic<bool>> done;
};

// Offering this executor to the next kregd (DESIGN §12).
enum class Offer {
  kNoKregd,  // nobody listens on the supervision socket (yet)
  kAdopted,  // the connection is the control socket from now on
  kDrain,    // end the sessions after their current reply and exit
  kRefused,  // go on as an orphan; do not offer again
  // Whoever listens is not of kregd's uid: nothing was offered; try
  // again later.
  kUnverified,
};

// Offers the executor to whoever listens on the supervision socket once it
// has shown to be the next kregd: the socket must have been bound by
// `kregd_uid` (that of the kregd that started the executor), and must
// answer the executor's challenge under its adoption key. Both are needed:
// any kregd answers any challenge, so a listener of another uid could
// relay it; and a socket of kregd's uid is not yet a kregd that holds the
// key (one that cannot prove it is refused like a kregd that refuses the
// executor: it does not offer itself again). The key is never sent.
Offer OfferToKregd(const v1::ExecInit& init, const v1::ExecInitReply& info,
                   uid_t kregd_uid, const StatusPage& page,
                   std::list<Served>* served, UniqueFd* control,
                   std::string* why) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string& path = init.supervision_socket();
  if (path.size() >= sizeof(addr.sun_path)) {
    *why = "the supervision socket's path is too long";
    return Offer::kRefused;
  }
  memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.ok() || ::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr),
                              sizeof(addr)) != 0) {
    return Offer::kNoKregd;
  }
  absl::StatusOr<PeerCred> listener = PeerCredOf(sock.get());
  if (!listener.ok() || listener->uid != kregd_uid) {
    *why = absl::StrCat(
        "the supervision socket ", path, " is bound by uid ",
        listener.ok()
            ? absl::StrCat(listener->uid, " (pid ", listener->pid, ")")
            : "unknown",
        ", not by kregd's uid ", kregd_uid,
        "; nothing was offered to it (its directory must be writable by "
        "kregd only)");
    return Offer::kUnverified;
  }
  timeval tv{5, 0};
  ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string challenge(kSupervisionChallengeBytes, '\0');
  if (::getrandom(challenge.data(), challenge.size(), 0) !=
      static_cast<ssize_t>(challenge.size())) {
    *why = absl::StrCat("getrandom for a challenge: ", strerror(errno));
    return Offer::kNoKregd;
  }
  struct Live {
    Served* served;
    std::shared_ptr<ExecutorBackend> backend;
    UniqueFd broker;  // the executor's end of the session's new broker
  };
  std::vector<Live> live;
  for (Served& s : *served) {
    if (s.done->load()) continue;
    std::shared_ptr<ExecutorBackend> b = s.backend.lock();
    if (b != nullptr && !b->LostDaemon()) live.push_back({&s, b, UniqueFd()});
  }
  v1::ExecReadopt m;
  m.set_pid(::getpid());
  m.set_uid(::getuid());
  m.set_gid(::getgid());
  m.set_group(init.group());
  m.set_slots(init.slots());
  m.set_adoption_nonce(init.adoption_nonce());
  m.set_challenge(challenge);
  m.set_settings_digest(init.settings_digest());
  m.set_session_protocol_major(kSessionProtocolMajor);
  m.set_session_protocol_minor(kSessionProtocolMinor);
  m.set_cuda_status(info.cuda_status());
  m.set_seccomp(info.seccomp());
  m.set_sessions(static_cast<uint32_t>(live.size()));
  auto lost = [why] {
    *why = "the supervision socket closed while the executor offered itself";
    return Offer::kNoKregd;
  };
  if (!SendMessage(sock.get(), m, {})) return lost();
  v1::ExecReadoptReply reply;
  int rc = wire::RecvMessage(sock.get(), 1 << 16, &reply);
  if (rc != wire::kOk && rc != wire::kMalformed) {
    *why = absl::StrCat("no answer from the new kregd (", wire::ResultText(rc),
                        ")");
    return Offer::kNoKregd;
  }
  v1::ExecReadoptProof proof;
  if (rc == wire::kMalformed ||
      !SameBytes(KregdProof(init.adoption_key(), challenge), reply.proof()) ||
      reply.challenge().size() != kSupervisionChallengeBytes) {
    // Of kregd's uid, so most likely a kregd with another state
    // directory's secret: an empty proof tells it so (and proves nothing).
    SendMessage(sock.get(), proof, {});
    *why = absl::StrCat(
        "the listener on ", path, " (pid ", listener->pid, ", uid ",
        listener->uid,
        ") did not prove that it holds this executor's adoption key",
        reply.status().message().empty()
            ? ""
            : absl::StrCat(" (it answered: ", reply.status().message(), ")"),
        "; nothing was offered to it");
    return Offer::kRefused;
  }
  proof.set_proof(ExecutorProof(init.adoption_key(), reply.challenge()));
  if (!SendMessage(sock.get(), proof, {page.fd()})) return lost();
  for (Live& l : live) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      *why = absl::StrCat("socketpair: ", strerror(errno));
      return Offer::kNoKregd;
    }
    l.broker = UniqueFd(sv[0]);
    UniqueFd theirs(sv[1]);
    v1::ExecReadoptSession rs;
    rs.set_session_id(l.served->session_id);
    rs.set_slot(l.served->slot);
    rs.set_states(l.served->session->StatesHeld());
    for (const auto& [key, token] : l.backend->Resolved()) {
      v1::ResolvedToken* t = rs.add_tokens();
      t->set_name(key.name);
      t->set_platform(PlatformName(key.platform));
      t->set_token(token);
    }
    if (!SendMessage(sock.get(), rs, {l.served->client_fd, theirs.get()})) {
      return lost();
    }
  }
  rc = wire::RecvMessage(sock.get(), 1 << 16, &reply);
  if (rc != wire::kOk) {
    *why = absl::StrCat("no answer from the new kregd (", wire::ResultText(rc),
                        ")");
    return Offer::kNoKregd;
  }
  if (reply.status().code() != 0) {
    *why = reply.status().message();
    return reply.drain() ? Offer::kDrain : Offer::kRefused;
  }
  v1::BrokerRequest closed;
  closed.mutable_closed();
  for (Live& l : live) {
    // A session that ended meanwhile tells the new kregd so itself.
    if (!l.backend->ReplaceBroker(&l.broker)) {
      SendMessage(l.broker.get(), closed, {});
    }
  }
  tv = timeval{0, 0};
  ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  *control = std::move(sock);
  return Offer::kAdopted;
}

// Process-wide settings made before anything else runs.
void ConfigureProcess() {
  CloseDescriptorsFrom(kStatusFd + 1);
  signal(SIGPIPE, SIG_IGN);
  // Clients' messages are buffered in every session thread's malloc arena.
  // glibc raises its mmap threshold each time a large buffer is freed, so
  // later large buffers come from those arenas and stay resident after
  // they are freed (an executor kept ~500 MB after a flood of 64 MiB
  // announcements had ended). A fixed threshold maps each buffer over
  // 128 KiB on its own and unmaps it when it is freed: RSS follows what
  // max_buffered_bytes accounts for.
  ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 20);
  // Debian's absl is built with its debug checks on: every absl::Mutex
  // lock then updates a process-wide lock graph under one global lock (a
  // handler call takes one such lock, and an executor's sessions all share
  // that graph). A debugging aid only: release builds of absl skip it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  spdlog::set_default_logger(spdlog::stderr_color_mt("kregd-exec"));
}

// What ExecInit sets of every session.
SessionLimits LimitsOf(const v1::ExecInit& init) {
  SessionLimits limits;
  limits.max_arena_bytes = init.max_arena_bytes();
  limits.max_message_bytes = init.max_message_bytes();
  if (init.max_module_bytes() != 0)
    limits.max_module_bytes = init.max_module_bytes();
  limits.spin_us = init.spin_us();
  limits.hello_timeout_ms = init.hello_timeout_ms();
  limits.launch_ring = !init.launch_ring_off();
  if (init.has_ring_spin_us()) limits.ring_spin_us = init.ring_spin_us();
  return limits;
}

// The executor after its start: the sessions kregd hands it and what it
// does once kregd is gone (DESIGN §12: serve on, offer itself to the next
// kregd, drain or end at orphan_timeout).
class ExecutorLoop {
 public:
  ExecutorLoop(const v1::ExecInit& init, const v1::ExecInitReply& info,
               uid_t kregd_uid, StatusPage* page, const ExecutorShared& shared)
      : init_(init),
        info_(info),
        kregd_uid_(kregd_uid),
        page_(page),
        shared_(shared),
        limits_(LimitsOf(init)),
        offer_(!init.supervision_socket().empty()) {
    if (init.max_buffered_bytes() != 0) {
      receive_budget_ =
          std::make_unique<wire::ByteBudget>(init.max_buffered_bytes());
      limits_.receive_budget = receive_budget_.get();
    }
  }

  // Serves until kregd ends it, the GPU must be recycled or an orphan's
  // time is up; then ends the sessions left. The exit code.
  int Serve() {
    int exit_code = 0;
    for (;;) {
      ReapFinished();
      if (shared_.recycle->load()) {
        exit_code = kExitRecycle;
        break;
      }
      if (orphan_since_ms_ != 0 ? !OrphanStep() : !ControlStep()) break;
    }
    for (Served& s : served_) s.session->Shutdown();
    for (Served& s : served_) s.thread.join();
    served_.clear();
    return exit_code;
  }

 private:
  void ReapFinished() {
    for (auto it = served_.begin(); it != served_.end();) {
      if (!it->done->load()) {
        ++it;
        continue;
      }
      it->thread.join();
      it = served_.erase(it);
    }
  }

  // One round without kregd: drain, offer, or wait. False: exit now.
  bool OrphanStep() {
    if (served_.empty()) {
      spdlog::info(shared_.drain->load()
                       ? "drained: the last session closed; exiting"
                       : "kregd is gone and the last session closed; exiting");
      return false;
    }
    const int64_t now_ms = ring::NowNs() / 1000000;
    if (shared_.drain->load()) {
      // Sessions between calls end now; the others after their reply.
      for (Served& s : served_) {
        if (page_->slot(s.slot)->token.load() == 0) s.session->Shutdown();
      }
    } else if (offer_ && now_ms - offered_ms_ >= 250) {
      offered_ms_ = now_ms;
      if (Offered()) return true;
    }
    if (now_ms - orphan_since_ms_ > int64_t{init_.orphan_timeout_s()} * 1000) {
      spdlog::info(
          "kregd has been gone for orphan_timeout ({} s); ending the {} "
          "session(s) left (their clients retry with the next kregd)",
          init_.orphan_timeout_s(), served_.size());
      return false;
    }
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, nullptr);
    return true;
  }

  // Offers this executor to a new kregd; true when its answer changed what
  // the executor does (adopted or draining).
  bool Offered() {
    UniqueFd control;
    std::string why;
    switch (OfferToKregd(init_, info_, kregd_uid_, *page_, &served_, &control,
                         &why)) {
      case Offer::kNoKregd:
        return false;
      case Offer::kAdopted:
        ::dup2(control.get(), kControlFd);
        orphan_since_ms_ = 0;
        spdlog::info("adopted by the new kregd; serving {} session(s) under it",
                     served_.size());
        return true;
      case Offer::kDrain:
        shared_.drain->store(true);
        spdlog::info(
            "the new kregd drains this executor: {}; ending the {} "
            "session(s) once their calls in flight are answered",
            why, served_.size());
        return true;
      case Offer::kUnverified:
        // Said once per listener (offers repeat every 250 ms).
        if (why != unverified_) {
          unverified_ = why;
          spdlog::warn("not offering this executor to a new kregd: {}", why);
        }
        return false;
      case Offer::kRefused:
        offer_ = false;
        spdlog::warn(
            "the new kregd did not adopt this executor: {}; serving the "
            "{} session(s) on until they close",
            why, served_.size());
        return false;
    }
    return false;
  }

  // One round under kregd: the next ExecAdopt on the control socket, if
  // any within 200 ms. False: exit now.
  bool ControlStep() {
    pollfd p{kControlFd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) return true;
    std::string payload;
    std::vector<int> fds;
    int rc = wire::RecvFrame(kControlFd, 1 << 16, &payload, &fds);
    if (rc != wire::kOk) {  // kregd closed the control socket
      if (init_.orphan_timeout_s() == 0 || served_.empty()) return false;
      // kregd stopped or died: the sessions' launches need no kregd, so
      // they go on; what needs kregd ends its session (LostDaemon).
      orphan_since_ms_ = ring::NowNs() / 1000000;
      spdlog::info(
          "kregd closed the control socket (it stopped or died); serving "
          "{} session(s) on until they close, at most orphan_timeout ({} s)",
          served_.size(), init_.orphan_timeout_s());
      return true;
    }
    std::vector<UniqueFd> owned;
    for (int fd : fds) owned.emplace_back(fd);
    v1::ExecAdopt adopt;
    if (adopt.ParseFromString(payload) && adopt.has_repoint()) {
      Repoint(adopt.repoint(), std::move(owned));
      return true;
    }
    if (!adopt.ParseFromString(payload) || owned.size() != 2 ||
        page_->slot(adopt.slot()) == nullptr) {
      spdlog::error("ignoring a malformed ExecAdopt from kregd");
      return true;
    }
    Start(adopt, std::move(owned[0]), std::move(owned[1]));
    return true;
  }

  // kregd replaced a target (docs/replace.md section 3): load the new
  // generation, switch the sessions' next launches to it, answer.
  void Repoint(const v1::ExecRepoint& repoint, std::vector<UniqueFd> fds) {
    v1::ExecRepointAck ack = ApplyRepoint(repoint, std::move(fds),
                                          shared_.modules, shared_.repoints);
    if (ack.status().code() == 0) {
      spdlog::info("target \"{}\" ({}) re-pointed to generation {} ({})",
                   repoint.target_name(), repoint.platform(),
                   repoint.generation(), repoint.module_digest());
    } else {
      spdlog::warn("{}", ack.status().message());
    }
    SendMessage(kControlFd, ack, {});
  }

  // A session kregd handed over: the client's socket and the broker's.
  void Start(const v1::ExecAdopt& adopt, UniqueFd client, UniqueFd broker) {
    PeerCred peer;
    peer.uid = adopt.uid();
    peer.gid = adopt.gid();
    peer.pid = adopt.pid();
    auto backend = std::make_shared<ExecutorBackend>(std::move(broker),
                                                     adopt.slot(), shared_);
    const int client_fd = client.get();
    auto session = std::make_shared<Session>(
        adopt.session_id(), std::move(client), peer, limits_, backend.get(),
        &page_->header()->counters, shared_.cuda);
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread t([session, backend, done]() mutable {
      session->Run();
      session.reset();  // releases the arena and GPU state first
      backend.reset();  // then tells kregd the session ended
      done->store(true);
    });
    served_.push_back({session, backend, client_fd, adopt.session_id(),
                       adopt.slot(), std::move(t), done});
  }

  const v1::ExecInit& init_;
  const v1::ExecInitReply& info_;
  const uid_t kregd_uid_;
  StatusPage* const page_;
  const ExecutorShared shared_;
  SessionLimits limits_;
  std::unique_ptr<wire::ByteBudget> receive_budget_;
  std::list<Served> served_;
  // Without kregd (DESIGN §12): since when, or 0 while kregd is there.
  int64_t orphan_since_ms_ = 0;
  // Offer the executor to the next kregd while an orphan (stops after a
  // refusal); when it last tried.
  bool offer_;
  int64_t offered_ms_ = 0;
  std::string unverified_;  // why the last listener was not offered to
};

// The start: ExecInit from kregd (and kregd's uid, `kregd_uid`), then the
// credentials, the parent tie, the status page, CUDA contexts and the
// seccomp filter, answered with ExecInitReply. Non-zero: the exit code of a
// failed start (said to kregd).
int StartUp(v1::ExecInit* init, v1::ExecInitReply* reply, uid_t* kregd_uid,
            std::optional<StatusPage>* page,
            std::unique_ptr<CudaDevices>* cuda) {
  const int rc = wire::RecvMessage(kControlFd, 1 << 20, init);
  if (rc != wire::kOk && rc != wire::kMalformed) {
    std::fprintf(stderr,
                 "kregd-exec: started without kregd's control socket;"
                 " it is started by kregd only\n");
    return 2;
  }
  if (rc == wire::kMalformed) {
    Reply(absl::InvalidArgumentError("malformed ExecInit"), *reply);
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(
      init->log_level().empty() ? "info" : init->log_level()));
  SetLogFormat("kregd-exec", absl::StrCat(" (", init->group(), ")"));
  auto fail = [reply](const absl::Status& s) {
    Reply(s, *reply);
    return 1;
  };
  // Who started the executor (who made its control socket): the only uid
  // it offers itself to once that kregd is gone.
  absl::StatusOr<PeerCred> kregd = PeerCredOf(kControlFd);
  if (!kregd.ok()) return fail(kregd.status());
  *kregd_uid = kregd->uid;
  if (init->drop_privileges()) {
    std::vector<gid_t> groups(init->groups().begin(), init->groups().end());
    absl::Status s = DropPrivileges(init->uid(), init->gid(), groups);
    if (!s.ok()) return fail(s);
  }
  if (absl::Status s =
          TieToParent(init->parent_pid(), init->orphan_timeout_s() == 0);
      !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<StatusPage> mapped =
      StatusPage::Map(UniqueFd(kStatusFd), init->slots());
  if (!mapped.ok()) return fail(mapped.status());
  page->emplace(*std::move(mapped));
  g_page = &**page;
  std::set_terminate(OnTerminate);
  RecordFatalSignals();
  // CUDA contexts now, before the seccomp filter and before any client
  // waits on a first launch (~150 ms per device).
  if (init->open_cuda()) {
    *cuda = CudaDevices::OpenSystem();
    if ((*cuda)->status().ok()) {
      spdlog::info("CUDA: {}", (*cuda)->Describe());
    } else {
      reply->set_cuda_status(std::string((*cuda)->status().message()));
    }
  } else {
    reply->set_cuda_status("kregd was started without CUDA");
  }
  if (init->seccomp()) {
    if (absl::Status s = InstallSeccompFilter(); !s.ok()) return fail(s);
  }
  reply->set_seccomp(init->seccomp());
  reply->set_uid(::getuid());
  reply->set_gid(::getgid());
  Reply(absl::OkStatus(), *reply);
  return 0;
}

int Main() {
  ConfigureProcess();
  v1::ExecInit init;
  v1::ExecInitReply reply;
  std::optional<StatusPage> page;
  std::unique_ptr<CudaDevices> cuda;
  uid_t kregd_uid = 0;
  if (int failed = StartUp(&init, &reply, &kregd_uid, &page, &cuda);
      failed != 0) {
    return failed;
  }
  FfiHost host;
  ModuleCache modules;
  std::atomic<bool> recycle{false};
  std::atomic<bool> drain{false};
  // ControlStep fills it from kregd's ExecRepoint frames (docs/replace.md
  // section 3).
  RepointTable repoints;
  // A CudaDevices that could not open a device still goes to the sessions:
  // a CUDA launch's refusal then says why (e.g. out of memory).
  // Destroyed after every session ended (ExecutorLoop::Serve returned).
  StateTable states(init.max_states_per_session());
  ExecutorShared shared{&modules, &host,  cuda.get(), &*page,
                        &recycle, &drain, &repoints,  &states};
  std::atomic<bool> stop_gpu_watch{false};
  std::thread gpu_watch;
  if (cuda && cuda->status().ok()) {
    gpu_watch =
        std::thread(WatchGpu, shared.cuda, &*page, &recycle, &stop_gpu_watch);
  }
  const int exit_code =
      ExecutorLoop(init, reply, kregd_uid, &*page, shared).Serve();
  stop_gpu_watch.store(true);
  if (gpu_watch.joinable()) gpu_watch.join();
  spdlog::default_logger()->flush();
  // Loaded modules' static destructors are not run: their code is not
  // trusted to tear down cleanly.
  std::fflush(nullptr);
  page->header()->exit_status.store(kExitKnown |
                                    (static_cast<uint32_t>(exit_code) << 8));
  ::_exit(exit_code);
}

}  // namespace
}  // namespace kreg

int main() { return kreg::Main(); }
