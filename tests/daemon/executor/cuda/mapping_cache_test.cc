// CudaMappingCache with fake mappings and fences: bounds, LRU eviction,
// fenced release, offset validation.
#include "daemon/executor/cuda/mapping_cache.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

class FakeMapping final : public CudaMapping {
 public:
  FakeMapping(uint64_t base, uint64_t size, int* live)
      : base_(base), size_(size), live_(live) {
    ++*live_;
  }
  ~FakeMapping() override { --*live_; }
  cu::CUdeviceptr base() const override { return base_; }
  uint64_t size() const override { return size_; }
  int ordinal() const override { return 0; }

 private:
  const uint64_t base_;
  const uint64_t size_;
  int* const live_;
};

// Fences that are done when the test says so.
class FakeFences final : public FenceSource {
 public:
  struct State {
    bool done = false;
    int waits = 0;
  };
  class FakeFence final : public Fence {
   public:
    explicit FakeFence(std::shared_ptr<State> s) : s_(std::move(s)) {}
    bool Done() override { return s_->done; }
    void Wait() override {
      ++s_->waits;
      s_->done = true;
    }

   private:
    std::shared_ptr<State> s_;
  };

  std::unique_ptr<Fence> Record(int) override {
    ++recorded;
    states.push_back(std::make_shared<State>());
    return std::make_unique<FakeFence>(states.back());
  }
  void CompleteAll() {
    for (auto& s : states) s->done = true;
  }

  int recorded = 0;
  std::vector<std::shared_ptr<State>> states;
};

CudaMappingKey Key(uint64_t base, uint64_t size = 4096, uint64_t gen = 1) {
  return CudaMappingKey{std::string(16, '\xa0'), base, size, gen};
}

struct Harness {
  int live = 0;
  int imports = 0;
  FakeFences fences;
  CudaMappingCache cache;

  explicit Harness(size_t max_entries, bool with_fences = true)
      : cache(CudaMappingCacheOptions{max_entries},
              with_fences ? &fences : nullptr) {}

  absl::StatusOr<std::shared_ptr<const CudaMapping>> Get(
      const CudaMappingKey& key) {
    return cache.GetOrImport(
        key, [&]() -> absl::StatusOr<std::unique_ptr<CudaMapping>> {
          ++imports;
          return std::make_unique<FakeMapping>(0x10000000 + key.base * 16,
                                               key.size, &live);
        });
  }
};

TEST_CASE("A mapping is imported once and found again", "[mapping_cache]") {
  Harness h(4);
  auto a = h.Get(Key(1));
  REQUIRE(a.ok());
  auto b = h.Get(Key(1));
  REQUIRE(b.ok());
  CHECK(a->get() == b->get());
  CHECK(h.imports == 1);
  CHECK(h.cache.size() == 1);
  CHECK(h.cache.Find(Key(1)).ok());
}

TEST_CASE("A new generation at the same address is a different allocation",
          "[mapping_cache]") {
  Harness h(4);
  REQUIRE(h.Get(Key(1, 4096, 1)).ok());
  REQUIRE(h.Get(Key(1, 4096, 2)).ok());
  CHECK(h.imports == 2);
  CHECK(h.cache.size() == 2);
}

TEST_CASE("Import errors pass through and cache nothing", "[mapping_cache]") {
  Harness h(4);
  auto r = h.cache.GetOrImport(
      Key(1), []() -> absl::StatusOr<std::unique_ptr<CudaMapping>> {
        return absl::InvalidArgumentError("bad fd");
      });
  CHECK(r.status() == absl::InvalidArgumentError("bad fd"));
  CHECK(h.cache.size() == 0);
}

TEST_CASE("A mapping whose size differs from the key is refused",
          "[mapping_cache]") {
  Harness h(4);
  int live = 0;
  auto r = h.cache.GetOrImport(
      Key(1, 4096), [&]() -> absl::StatusOr<std::unique_ptr<CudaMapping>> {
        return std::make_unique<FakeMapping>(0x1000, 8192, &live);
      });
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(live == 0);
  CHECK(h.cache.size() == 0);
}

TEST_CASE("The cache is bounded and evicts the least recently used",
          "[mapping_cache]") {
  Harness h(2);
  REQUIRE(h.Get(Key(1)).ok());
  REQUIRE(h.Get(Key(2)).ok());
  REQUIRE(h.cache.Find(Key(1)).ok());  // 2 is now least recently used
  REQUIRE(h.Get(Key(3)).ok());
  CHECK(h.cache.size() == 2);
  CHECK(h.cache.Find(Key(1)).ok());
  CHECK(h.cache.Find(Key(3)).ok());
  absl::StatusOr<std::shared_ptr<const CudaMapping>> gone =
      h.cache.Find(Key(2));
  CHECK(gone.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(gone.status().message()).find("send its handle again") !=
        std::string::npos);
}

TEST_CASE("An evicted mapping is released only after its fence",
          "[mapping_cache]") {
  Harness h(1);
  REQUIRE(h.Get(Key(1)).ok());
  REQUIRE(h.Get(Key(2)).ok());
  CHECK(h.fences.recorded == 1);
  CHECK(h.cache.retired() == 1);
  CHECK(h.live == 2);  // the evicted one is still mapped
  h.cache.Reap();
  CHECK(h.live == 2);
  h.fences.CompleteAll();
  h.cache.Reap();
  CHECK(h.cache.retired() == 0);
  CHECK(h.live == 1);
}

TEST_CASE("Without a fence source an evicted mapping is released at once",
          "[mapping_cache]") {
  Harness h(1, /*with_fences=*/false);
  REQUIRE(h.Get(Key(1)).ok());
  REQUIRE(h.Get(Key(2)).ok());
  CHECK(h.live == 1);
  CHECK(h.cache.retired() == 0);
}

TEST_CASE(
    "A mapping held by a launch outlives its eviction and is fenced "
    "after release",
    "[mapping_cache]") {
  Harness h(1);
  REQUIRE(h.Get(Key(1)).ok());
  auto held = h.cache.Resolve(Key(1), 0, 16);
  REQUIRE(held.ok());
  REQUIRE(h.Get(Key(2)).ok());  // evicts 1 while it is held
  CHECK(h.fences.recorded == 0);
  h.fences.CompleteAll();
  h.cache.Reap();
  CHECK(h.live == 2);
  *held = CudaMappingCache::Resolved{};  // the launch let go
  h.cache.Reap();                        // fences its last use
  CHECK(h.fences.recorded == 1);
  CHECK(h.live == 2);
  h.fences.CompleteAll();
  h.cache.Reap();
  CHECK(h.live == 1);
}

TEST_CASE("Resolve validates offset and length against the mapping",
          "[mapping_cache]") {
  Harness h(4);
  REQUIRE(h.Get(Key(1, 4096)).ok());
  const uintptr_t base = 0x10000000 + 16;
  auto ok = h.cache.Resolve(Key(1, 4096), 100, 200);
  REQUIRE(ok.ok());
  CHECK(reinterpret_cast<uintptr_t>(ok->data) == base + 100);
  CHECK(h.cache.Resolve(Key(1, 4096), 0, 4096).ok());
  CHECK(h.cache.Resolve(Key(1, 4096), 4096, 0).ok());
  auto past = h.cache.Resolve(Key(1, 4096), 4000, 97);
  CHECK(past.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(past.status().message()) ==
        "CUDA buffer [4000, 4097) ends past its allocation of 4096 bytes");
  CHECK(h.cache.Resolve(Key(1, 4096), 4097, 0).status().code() ==
        absl::StatusCode::kOutOfRange);
  auto overflow = h.cache.Resolve(Key(1, 4096), UINT64_MAX - 1, 4);
  CHECK(overflow.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(overflow.status().message()).find("overflows 64 bits") !=
        std::string::npos);
  CHECK(h.cache.Resolve(Key(9), 0, 1).status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("Erase retires a mapping", "[mapping_cache]") {
  Harness h(4);
  REQUIRE(h.Get(Key(1)).ok());
  CHECK(h.cache.Erase(Key(1)));
  CHECK_FALSE(h.cache.Erase(Key(1)));
  CHECK(h.cache.size() == 0);
  h.fences.CompleteAll();
  h.cache.Reap();
  CHECK(h.live == 0);
}

TEST_CASE("Close waits for the fences and releases everything",
          "[mapping_cache]") {
  Harness h(1);
  REQUIRE(h.Get(Key(1)).ok());
  REQUIRE(h.Get(Key(2)).ok());  // 1 retired behind a pending fence
  h.cache.Close();
  CHECK(h.live == 0);
  CHECK(h.cache.size() == 0);
  CHECK(h.cache.retired() == 0);
  int waits = 0;
  for (auto& s : h.fences.states) waits += s->waits;
  CHECK(waits == 2);  // the eviction fence and a final one for the live entry
}

TEST_CASE("The destructor releases everything", "[mapping_cache]") {
  int live = 0;
  {
    FakeFences fences;
    CudaMappingCache cache(CudaMappingCacheOptions{4}, &fences);
    REQUIRE(cache
                .GetOrImport(
                    Key(1),
                    [&]() -> absl::StatusOr<std::unique_ptr<CudaMapping>> {
                      return std::make_unique<FakeMapping>(0x1000, 4096, &live);
                    })
                .ok());
    CHECK(live == 1);
  }
  CHECK(live == 0);
}

}  // namespace
}  // namespace kreg
