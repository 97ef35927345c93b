// The shared-memory launch ring of a session (DESIGN §9): the layout of the
// control region both processes map, the fixed-layout launch descriptor and
// completion entry, and spin-then-futex helpers. Shared by kregd-exec and
// the in-process shim, so it depends on nothing but libc (like wire.h).
//
// The control region is its own memfd (RingSetup in session.proto), created
// by the client, sealed against shrinking and growing, mapped once for the
// session's lifetime (the arena is replaced when it grows; the ring is not).
//
//   [0, kControlBytes)                 Control: indices, doorbells, flags
//   [kSubmitOffset, +kSlots*kSubmitSlotBytes)     submission slots
//   [kCompleteOffset, +kSlots*kCompleteSlotBytes) completion slots
//
// Single producer, single consumer each way. The client writes a
// descriptor into submission slot (sq_tail % kSlots), then publishes it by
// storing sq_tail + 1; if sq_waiting is set it FUTEX_WAKEs sq_tail. The
// executor copies the slot out of shared memory before it reads any field,
// validates it (as it does a socket Launch's), runs the handler, writes
// completion slot (cq_tail % kSlots), stores cq_tail + 1 and wakes cq_tail when
// cq_waiting is set. Both sides spin a bounded time before they set their
// waiting word and FUTEX_WAIT (shared futexes: the two processes map the
// same memfd) on the other side's tail. The executor trusts nothing in the
// region: it keeps its own indices and checks the client's against them.
//
// CPU launches and, since version 2, steady-state CUDA launches use it (see
// SubmitHeader). The client keeps at most one launch in flight (an
// asynchronous CUDA launch until the session's next call).
#ifndef KREGD_COMMON_RING_LAYOUT_H_
#define KREGD_COMMON_RING_LAYOUT_H_

#include <cstddef>
#include <cstdint>

namespace kreg {
namespace ring {

// HelloReply.launch_ring / RingSetup.version: the layout below. 2: CUDA
// launches (the CUDA fields of SubmitHeader, CudaRef, completion flags).
constexpr uint32_t kVersion = 2;
constexpr uint32_t kMagic = 0x4b524e47;  // "KRNG"
constexpr uint32_t kSlots = 4;           // a power of two
constexpr uint32_t kSubmitSlotBytes = 16 * 1024;
constexpr uint32_t kCompleteSlotBytes = 4 * 1024;

// One 32-bit word on its own cache line.
struct alignas(64) Word {
  uint32_t value;
};

struct Control {
  uint32_t magic;    // kMagic, written by the client (informational)
  uint32_t version;  // kVersion
  Word sq_tail;      // client: descriptors published; the executor's futex
  Word sq_head;      // executor: descriptors taken (their slots are free)
  Word sq_waiting;   // executor: 1 while it sleeps (or is about to)
  Word cq_tail;      // executor: completions published; the client's futex
  Word cq_head;      // client: completions consumed
  Word cq_waiting;   // client: 1 while it sleeps (or is about to)
  Word closed;       // executor: 1 once it stopped serving the ring
};

constexpr size_t kControlBytes = 4096;
static_assert(sizeof(Control) <= kControlBytes, "Control outgrew its page");
constexpr size_t kSubmitOffset = kControlBytes;
constexpr size_t kCompleteOffset =
    kSubmitOffset + size_t{kSlots} * kSubmitSlotBytes;
constexpr size_t kRegionBytes =
    kCompleteOffset + size_t{kSlots} * kCompleteSlotBytes;

// A launch descriptor: this header at the start of a submission slot, then
// target_len bytes of target name, platform_len bytes of platform, zero
// padding to a multiple of 8, num_args + num_rets BufferDescs (args first),
// each followed (platform "cuda" only) by a CudaRef and then by `rank` int64
// dims, then attrs_len bytes of attributes: the protobuf encoding of a
// kreg.v1.AttributeBlock (byte-exact as XLA passed them, sorted by name).
// `length` covers all of it. A buffer's `size` is product(dims) times its
// dtype's byte width; an aliased input/output pair uses the same region.
//
// The same descriptor is the one encoding of a launch on the session socket
// too (kreg.v1.Launch.descriptor, for what does not go on the ring): there
// it may be longer than a slot, its seq, tag and flags are not used, and a CUDA
// descriptor's doorbell_seq may be 0 (ordered by interprocess events).
//
// A CUDA descriptor (platform "cuda") is a steady-state launch: every
// buffer's allocation is already shared in the session (no new shares, no
// fds, no releases) and it is ordered by the session's doorbell of
// `device_uuid` with `doorbell_seq` (> 0). A BufferDesc's `offset` is then
// inside its CudaRef's allocation; a 0-byte buffer has an all-zero CudaRef
// (the handler sees null). A CPU descriptor has all CUDA fields zero.
constexpr uint32_t kSubmitAsync = 1;  // flags: the client does not wait
// flags: the client traces this launch's stages (KREG_TRACE_STAGES=1, for
// bench/): the executor stamps its own in the completion's StageTrailer.
constexpr uint32_t kSubmitTrace = 2;
constexpr uint32_t kSubmitFlags = kSubmitAsync | kSubmitTrace;  // all known
struct SubmitHeader {
  uint32_t length;
  uint32_t seq;  // the descriptor's sq position (sq_tail before publishing)
  uint64_t tag;  // echoed in the completion
  int64_t run_id;
  int32_t device_ordinal;
  uint32_t num_args;
  uint32_t num_rets;
  uint32_t target_len;
  uint32_t platform_len;
  uint32_t attrs_len;
  // Version 2: CUDA launches (zero in a CPU descriptor).
  uint64_t doorbell_seq;
  uint8_t device_uuid[16];  // cuDeviceGetUuid's raw bytes
  uint32_t flags;           // kSubmit* bits
  // The generation the client pinned (docs/replace.md §7); 0: the current.
  uint32_t generation;
  // The call site's state (a handle the session's Instantiate returned,
  // session.proto); 0: none (docs/kernel-author-guide.md, "Handler
  // bundles and state").
  uint64_t state;
};
static_assert(sizeof(SubmitHeader) == 88, "SubmitHeader layout");

struct BufferDesc {
  int32_t dtype;  // XLA_FFI_DataType
  uint32_t rank;
  uint64_t offset;  // in the session arena
  uint64_t size;
};
static_assert(sizeof(BufferDesc) == 24, "BufferDesc layout");

// The client GPU allocation of a CUDA descriptor's buffer (what
// kreg.v1.CudaMappingRef names; its device is the header's device_uuid).
struct CudaRef {
  uint64_t base;
  uint64_t size;
  uint64_t generation;
};
static_assert(sizeof(CudaRef) == 24, "CudaRef layout");

// CompletionHeader.flags of a CUDA launch (LaunchReply's fields):
// the executor enqueued done := doorbell_seq on its session stream (after
// the handler, also when it failed or did not run), so the client may wait
// for it; a buffer named an allocation the session does not hold (the
// handler did not run; the client shares again on the socket).
constexpr uint32_t kDoneSignalled = 1;
constexpr uint32_t kMappingMissing = 2;

// A completion entry: this header, then message_len bytes of message.
struct CompletionHeader {
  uint32_t seq;  // the descriptor's seq
  int32_t code;  // absl/XLA FFI status code, 0 = OK
  uint64_t tag;
  uint32_t message_len;
  uint32_t truncated;  // 1: the message was cut to fit (a marker ends it)
  uint32_t flags;      // kDoneSignalled | kMappingMissing
  uint32_t reserved;
};
static_assert(sizeof(CompletionHeader) == 32, "CompletionHeader layout");
// The last bytes of a completion slot: the executor's stage stamps
// (CLOCK_MONOTONIC ns; 0: not reached) of a launch submitted with
// kSubmitTrace; `present` is 1 then. Untrusted numbers, for benchmarks.
struct StageTrailer {
  uint32_t present;
  uint32_t reserved;
  int64_t picked_ns;         // the ring thread took the descriptor
  int64_t decoded_ns;        // validated and decoded
  int64_t handler_start_ns;  // the call frame is built; the handler starts
  int64_t handler_end_ns;    // the handler returned
  int64_t completed_ns;      // just before the completion is published
  int64_t spare[2];
};
static_assert(sizeof(StageTrailer) == 64, "StageTrailer layout");
constexpr size_t kMaxMessageBytes =
    kCompleteSlotBytes - sizeof(CompletionHeader) - sizeof(StageTrailer);
inline char* TrailerOf(char* slot) {
  return slot + kCompleteSlotBytes - sizeof(StageTrailer);
}
inline const char* TrailerOf(const char* slot) {
  return slot + kCompleteSlotBytes - sizeof(StageTrailer);
}

inline Control* ControlOf(char* base) {
  return reinterpret_cast<Control*>(base);
}
inline char* SubmitSlot(char* base, uint32_t index) {
  return base + kSubmitOffset + size_t{index % kSlots} * kSubmitSlotBytes;
}
inline char* CompleteSlot(char* base, uint32_t index) {
  return base + kCompleteOffset + size_t{index % kSlots} * kCompleteSlotBytes;
}

// Sequentially consistent loads and stores of a shared word (the waiting
// flags pair with the tails Dekker-style, so both need a full fence).
inline uint32_t Load(const Word& w) {
  return __atomic_load_n(&w.value, __ATOMIC_SEQ_CST);
}
inline void Store(Word& w, uint32_t v) {
  __atomic_store_n(&w.value, v, __ATOMIC_SEQ_CST);
}

// FUTEX_WAIT (shared) on `w` while it holds `expected`, for at most
// `timeout_ns` (< 0: no limit). Returns at once if the word differs.
// Spurious returns are possible: callers re-check.
void FutexWait(Word* w, uint32_t expected, int64_t timeout_ns);
// FUTEX_WAKE (shared) of every waiter on `w`.
void FutexWake(Word* w);

// Monotonic clock in nanoseconds.
int64_t NowNs();

// How long one waiter (a ring side: the client's completion waits, or an
// executor ring thread's submission waits) spins before it sleeps, learnt
// from its own recent waits, the way adaptive mutexes decide (DESIGN §9):
// it spins while spins would have caught its waits and backs off (halved
// spins, then sleeping at once) while they would not; a spin that lost its
// CPU (the machine is oversubscribed: spinning takes the CPU the other side
// needs) makes the next 1, 2, 4 ... 64 waits sleep at once. A waiter that
// has seen no call for a while (waits longer than a spin) sleeps at once.
// Not thread-safe: one per waiting thread.
class SpinPolicy {
 public:
  // `limit_ns`: the configured spin (ring_spin_us, KREG_RING_SPIN_US); a
  // spin stretches up to kStretch times it to cover waits known to be that
  // short. 0: never spin. `adaptive` false (KREG_RING_ADAPTIVE=0): always
  // spin `limit_ns`.
  explicit SpinPolicy(int64_t limit_ns, bool adaptive = AdaptiveDefault());
  // The spin of the next wait (0: sleep at once).
  int64_t Next();
  // What that wait saw: how long it took until the word changed (a wait
  // that ended without a change counts as long), whether it spun, and
  // whether the spinning thread lost its CPU while it spun.
  void Record(int64_t waited_ns, bool spun, bool preempted);

  static constexpr int64_t kStretch = 4;
  static constexpr int kMaxBackoff = 64;
  // False with KREG_RING_ADAPTIVE=0 in the environment.
  static bool AdaptiveDefault();

 private:
  // The spin that would catch a typical wait: at least limit_ns_.
  int64_t Base() const;

  const int64_t limit_ns_;
  const bool adaptive_;
  int64_t typical_ns_ = 0;  // moving average of the waits a spin caught
  int misses_ = 0;          // consecutive waits a Base() spin would miss
  int skip_ = 0;            // waits left that sleep at once
  int backoff_ = 0;         // waits skipped after the last preempted spin
};

// Busy-waits up to `spin_ns` for `w` to differ from `value` (a CPU pause
// between loads). True if it changed. `*preempted` (if given) is set when
// the spinning thread lost its CPU meanwhile (a gap between two clock
// reads longer than 64 pauses can take).
bool SpinWhileEqual(const Word& w, uint32_t value, int64_t spin_ns,
                    bool* preempted = nullptr);

// Spin-then-futex wait for `w` to leave `value`: spins what `policy`
// says, then sets `waiting` to 1, re-checks and sleeps (each sleep at most
// `slice_ns`, < 0: unbounded), clearing `waiting` before it returns, and
// tells `policy` what it saw. Returns true when the word changed, false
// when a sleep slice ended without a change (the caller checks its other
// conditions and calls again). Spins are skipped while MachineBusy().
bool SpinThenWait(Word* w, uint32_t value, Word* waiting, SpinPolicy* policy,
                  int64_t slice_ns);

// A cheap veto for a clearly oversubscribed machine: more runnable threads
// than twice the CPUs this process may use (/proc/loadavg, at most every
// 5 ms, not counting this process's threads spinning in SpinThenWait), until
// they fall back to the CPUs. Always false with KREG_RING_ADAPTIVE=0.
bool MachineBusy();
// MachineBusy()'s hysteresis: whether the machine is busy now, given
// whether it was, the runnable threads and the CPUs.
bool BusyAfter(bool busy, int runnable, int cpus);

}  // namespace ring
}  // namespace kreg

#endif  // KREGD_COMMON_RING_LAYOUT_H_
