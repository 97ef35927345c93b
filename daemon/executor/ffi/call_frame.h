// Internal to //daemon/executor/ffi: turns a LaunchFrame into an
// XLA_FFI_CallFrame.
#ifndef KREGD_DAEMON_EXECUTOR_FFI_CALL_FRAME_H_
#define KREGD_DAEMON_EXECUTOR_FFI_CALL_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/wire.h"
#include "daemon/base/launch.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace ffi_internal {

// What the attribute tables built from `list` take (an estimate from the
// attributes: tables, aligned value copies and their bookkeeping), charged
// to a CallFrameStorage's budget before they are built.
uint64_t AttrTablesBytes(const AttrList& list);

// Owns everything the XLA_FFI_CallFrame built from a LaunchFrame points to:
// XLA_FFI_Buffers and their dims, the attribute tables and aligned copies of
// scalar and array values. String values and attribute names point into the
// LaunchFrame, as do buffer data pointers: it must outlive the call.
// Reusable: Prepare() refills the buffer tables in place (no allocation once
// they are large enough) and keeps the attribute tables of the last
// kAttrTables nonzero attrs_generations it saw (a frame with generation 0
// gets new ones every call), so a caller that keeps one (FfiHost's
// CallFrameCache) allocates nothing per call in steady state, even when a
// few call sites alternate. Not thread-safe. Not copyable or movable
// (self-referential).
//
// With a budget, each kept set of attribute tables is charged to it (an
// estimate from the attributes, taken before the tables are built) and given
// back when the set is evicted or the storage destroyed.
class CallFrameStorage {
 public:
  // `budget` (null: unbounded) must outlive the storage.
  explicit CallFrameStorage(wire::ByteBudget* budget = nullptr)
      : budget_(budget) {}

  // Makes frame() the call frame of `frame` (validated at the edge:
  // RingDecoder): stage EXECUTE, null api/ctx/extension_start/future.
  // RESOURCE_EXHAUSTED (OverBudgetText) when the budget cannot cover new
  // attribute tables even after evicting the others; frame() is then
  // unusable until a Prepare succeeds.
  absl::Status Prepare(const LaunchFrame& frame);

  // Bytes held of the budget by the kept attribute tables.
  uint64_t charged_bytes() const;

  CallFrameStorage(const CallFrameStorage&) = delete;
  CallFrameStorage& operator=(const CallFrameStorage&) = delete;

  XLA_FFI_CallFrame* frame() { return &frame_; }

 private:
  void BuildBuffers(const LaunchFrame& frame);
  void BuildAttrs(const AttrList& list, XLA_FFI_Attrs* out);

  static constexpr size_t kAttrTables = 16;

  // The attribute tables built for one attrs_generation.
  struct AttrTables {
    uint64_t generation = 0;  // 0: being built, or unusable
    uint64_t used = 0;
    XLA_FFI_Attrs attrs{};                     // the top-level table
    std::vector<std::shared_ptr<void>> owned;  // every table and value
    wire::BudgetHold hold;                     // what `owned` is charged
  };

  // Frees `t`'s tables and gives their charge back.
  static void Drop(AttrTables* t);
  // Charges `need` bytes to `t` (which holds nothing), evicting the least
  // recently used other tables while the budget cannot cover it.
  absl::Status Charge(AttrTables* t, uint64_t need);

  // Keeps `value` alive as long as the tables being built; returns its
  // stable address.
  template <typename T>
  T* Own(T value) {
    auto owned = std::make_shared<T>(std::move(value));
    T* raw = owned.get();
    building_->owned.push_back(std::move(owned));
    return raw;
  }

  XLA_FFI_CallFrame frame_{};
  std::vector<XLA_FFI_Buffer> buffers_;  // args, then rets
  std::vector<int64_t> dims_;            // all buffers' dims
  std::vector<XLA_FFI_ArgType> arg_types_;
  std::vector<void*> arg_ptrs_;
  std::vector<XLA_FFI_RetType> ret_types_;
  std::vector<void*> ret_ptrs_;
  wire::ByteBudget* const budget_;
  std::vector<AttrTables> attr_tables_;  // at most kAttrTables
  AttrTables* building_ = nullptr;       // where Own() puts what it keeps
  uint64_t clock_ = 0;
};

}  // namespace ffi_internal
}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_FFI_CALL_FRAME_H_
