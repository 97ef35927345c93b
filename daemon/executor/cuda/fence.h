// A point in a device's session stream: done once the GPU work queued on the
// stream before it has completed. Lets owners of GPU memory release it
// without synchronising the host on the launch path.
#ifndef KREGD_DAEMON_EXECUTOR_CUDA_FENCE_H_
#define KREGD_DAEMON_EXECUTOR_CUDA_FENCE_H_

#include <memory>

namespace kreg {

class Fence {
 public:
  virtual ~Fence() = default;
  // Non-blocking. A fence whose device failed counts as done.
  virtual bool Done() = 0;
  // Blocks until Done() (session close only, never on the launch path).
  virtual void Wait() = 0;
};

// Records fences on the streams of one session. Thread-safe.
class FenceSource {
 public:
  virtual ~FenceSource() = default;
  // A fence after all work queued so far for kregd device `ordinal`; null if
  // there is nothing to wait for (no stream yet) or recording failed.
  virtual std::unique_ptr<Fence> Record(int ordinal) = 0;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_CUDA_FENCE_H_
