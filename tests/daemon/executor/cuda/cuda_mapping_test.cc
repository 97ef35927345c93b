// VmmImport, IpcMemOpen and IpcEventOpen over a fake driver: what is imported,
// mapped and released, and every refusal.
#include "daemon/executor/cuda/cuda_mapping.h"

#include <fcntl.h>

#include <memory>
#include <sstream>
#include <string>

#include "catch2/catch.hpp"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/testing/fake_cuda.h"

namespace kreg {
namespace {

using testing::FakeCuda;

constexpr uint64_t kMiB = 1 << 20;

bool Contains(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

bool FdOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

void CheckNothingLive(const FakeCuda& fake) {
  CHECK(fake.live_handles == 0);
  CHECK(fake.live_reservations == 0);
  CHECK(fake.live_maps == 0);
  CHECK(FakeCuda::PushedDepth() == 0);
}

TEST_CASE("A VMM fd is imported, mapped read-write and released",
          "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  const int fd = fake.ExportAllocation(8 * kMiB);
  {
    auto m = VmmImport::Import(devices.get(), 0, UniqueFd(fd), 8 * kMiB);
    REQUIRE(m.ok());
    CHECK((*m)->size() == 8 * kMiB);
    CHECK((*m)->ordinal() == 0);
    CHECK((*m)->base() != 0);
    CHECK_FALSE(FdOpen(fd));  // closed once imported
    CHECK(fake.live_handles == 1);
    CHECK(fake.live_reservations == 1);
    CHECK(fake.live_maps == 1);
    CHECK(FakeCuda::PushedDepth() == 0);
  }
  CheckNothingLive(fake);
}

// Captures the default logger's output at debug level while it lives.
class DebugLogCapture {
 public:
  DebugLogCapture()
      : previous_(spdlog::default_logger()), level_(spdlog::get_level()) {
    auto logger = std::make_shared<spdlog::logger>(
        "capture", std::make_shared<spdlog::sinks::ostream_sink_st>(out_));
    logger->set_level(spdlog::level::debug);
    spdlog::set_default_logger(logger);
  }
  ~DebugLogCapture() {
    spdlog::set_default_logger(previous_);
    spdlog::set_level(level_);
  }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
  spdlog::level::level_enum level_;
};

TEST_CASE(
    "At debug level a mapping logs its device when made and when released",
    "[cuda_mapping]") {
  // tests/gpu/test_multi_gpu.py parses these lines.
  DebugLogCapture log;
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  const std::string uuid = devices->info(0).uuid_text;
  const int fd = fake.ExportAllocation(8 * kMiB);
  std::string base_hex;
  {
    auto m = VmmImport::Import(devices.get(), 0, UniqueFd(fd), 8 * kMiB);
    REQUIRE(m.ok());
    std::ostringstream hex;
    hex << std::hex << (*m)->base();
    base_hex = hex.str();
  }
  const std::string text = log.text();
  CHECK(text.find("CUDA mapping 0x" + base_hex + " (+8388608 bytes, VMM " +
                  "import) mapped on kregd device 0 " + uuid +
                  "; driver: resident on device ") != std::string::npos);
  CHECK(text.find("CUDA mapping 0x" + base_hex +
                  " (+8388608 bytes) on kregd device 0 " + uuid +
                  " released") != std::string::npos);
  CheckNothingLive(fake);
}

TEST_CASE("A failed import logs neither mapped nor released",
          "[cuda_mapping]") {
  DebugLogCapture log;
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  const int fd = fake.ExportAllocation(8 * kMiB);
  auto m = VmmImport::Import(devices.get(), 0, UniqueFd(fd), 3 * kMiB);
  CHECK_FALSE(m.ok());
  CHECK(log.text().find("CUDA mapping 0x") == std::string::npos);
}

TEST_CASE(
    "A VMM mapping whose size is not a multiple of the granularity is "
    "refused",
    "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  const int fd = fake.ExportAllocation(8 * kMiB);
  auto m = VmmImport::Import(devices.get(), 0, UniqueFd(fd), 3 * kMiB);
  CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(m.status(),
                 "a CUDA VMM mapping of 3145728 bytes is not a "
                 "multiple of the allocation granularity 2097152"));
  CHECK_FALSE(FdOpen(fd));
  CheckNothingLive(fake);
}

TEST_CASE("A VMM mapping larger than the exported allocation is refused",
          "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  const int fd = fake.ExportAllocation(4 * kMiB);
  auto m = VmmImport::Import(devices.get(), 0, UniqueFd(fd), 8 * kMiB);
  CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(m.status(), "cuMemMap of 8388608 bytes"));
  CHECK(Contains(m.status(), "larger than the exported allocation"));
  CheckNothingLive(fake);
}

TEST_CASE("An fd that is not an exported allocation is refused",
          "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto m = VmmImport::Import(devices.get(), 0, UniqueFd(fd), 2 * kMiB);
  CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(m.status(), "cuMemImportFromShareableHandle"));
  CHECK(Contains(m.status(), "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"));
  CHECK_FALSE(FdOpen(fd));
  CheckNothingLive(fake);
}

TEST_CASE("Host memory is not imported as a device mapping", "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  const int fd = fake.ExportAllocation(2 * kMiB, /*device_memory=*/false);
  auto m = VmmImport::Import(devices.get(), 0, UniqueFd(fd), 2 * kMiB);
  CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(m.status(), "is not device memory"));
  CheckNothingLive(fake);
}

TEST_CASE("VMM imports need VMM and POSIX-fd support", "[cuda_mapping]") {
  FakeCuda fake;
  fake.devices[0].posix_fd = false;
  auto devices = CudaDevices::Open(fake.driver(), "");
  const int fd = fake.ExportAllocation(2 * kMiB);
  auto m = VmmImport::Import(devices.get(), 0, UniqueFd(fd), 2 * kMiB);
  CHECK(m.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_FALSE(FdOpen(fd));
}

TEST_CASE("VMM imports of 0 bytes or without an fd are refused",
          "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CHECK(VmmImport::Import(devices.get(), 0,
                          UniqueFd(fake.ExportAllocation(kMiB)), 0)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(VmmImport::Import(devices.get(), 0, UniqueFd(), 2 * kMiB)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "A sticky error while mapping breaks the device and releases the "
    "import",
    "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  fake.FailNext("cuMemSetAccess", cu::CUDA_ERROR_ILLEGAL_ADDRESS);
  auto m = VmmImport::Import(
      devices.get(), 0, UniqueFd(fake.ExportAllocation(2 * kMiB)), 2 * kMiB);
  CHECK(m.status().code() == absl::StatusCode::kInternal);
  CHECK(Contains(m.status(), "sticky error in cuMemSetAccess"));
  CHECK_FALSE(devices->CheckUsable(0).ok());
  CheckNothingLive(fake);
}

TEST_CASE("Legacy IPC memory is opened and closed", "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  cu::CUipcMemHandle h = fake.IpcAllocation(1000);
  {
    auto m = IpcMemOpen::Open(devices.get(), 0, h, 1000);
    REQUIRE(m.ok());
    CHECK((*m)->size() == 1000);
    CHECK(fake.live_ipc_opens == 1);
  }
  CHECK(fake.live_ipc_opens == 0);
  CHECK(FakeCuda::PushedDepth() == 0);
}

TEST_CASE("An IPC mapping claiming more than its handle maps is refused",
          "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  auto m = IpcMemOpen::Open(devices.get(), 0, fake.IpcAllocation(1000), 5000);
  CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(m.status(),
                 "a CUDA IPC mapping claims 5000 bytes but its handle maps "
                 "1000 bytes"));
  CHECK(fake.live_ipc_opens == 0);
}

TEST_CASE("A bad IPC memory handle is refused", "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  cu::CUipcMemHandle bogus{};
  auto m = IpcMemOpen::Open(devices.get(), 0, bogus, 64);
  CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(m.status(), "cuIpcOpenMemHandle"));
}

TEST_CASE("IPC events are opened, waited on, recorded and destroyed",
          "[cuda_mapping]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  auto stream = reinterpret_cast<cu::CUstream>(0x2001);
  {
    auto e = IpcEventOpen::Open(devices.get(), 0, fake.IpcEvent());
    REQUIRE(e.ok());
    CHECK(fake.live_events == 1);
    CHECK((*e)->WaitOn(stream).ok());
    CHECK((*e)->RecordOn(stream).ok());
    CHECK(fake.event_log ==
          std::vector<std::string>{"wait event0", "record event0"});
  }
  CHECK(fake.live_events == 0);
  cu::CUipcEventHandle bogus{};
  CHECK(IpcEventOpen::Open(devices.get(), 0, bogus).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kreg
