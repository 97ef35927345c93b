// The CUDA kernel modules on a machine without a GPU: they load without
// libcuda (the CUDA runtime is static and lazy), export exactly their
// handlers, answer XLA's metadata call, and fail cleanly without a stream.
// Their numerics are checked on the GPU by tests/gpu/test_cuda_inprocess.py.
#include <dlfcn.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/base/launch.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

void* Open(const std::string& module) {
  const std::string path = "./kernels/cuda/" + module;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  INFO(path << ": " << (lib == nullptr ? dlerror() : "loaded"));
  REQUIRE(lib != nullptr);
  return lib;
}

const std::vector<std::string> kDemo = {"Scale",      "AddMul",
                                        "Fail",       "AttrsDigest",
                                        "Accumulate", "AccumulateInPlace",
                                        "ScratchSum"};
const std::vector<std::string> kBrainevent = {"CsrEventMatvec",
                                              "CsrEventMatvecT"};

TEST_CASE("Every CUDA handler answers the metadata call with API 0.4",
          "[cuda_kernels]") {
  for (const auto& [module, symbols] :
       {std::pair{std::string("libdemo_cuda.so"), kDemo},
        std::pair{std::string("libbrainevent_cuda.so"), kBrainevent}}) {
    void* lib = Open(module);
    for (const std::string& symbol : symbols) {
      INFO(module << ": " << symbol);
      void* handler = dlsym(lib, symbol.c_str());
      REQUIRE(handler != nullptr);
      absl::StatusOr<HandlerInfo> info = QueryHandlerMetadata(handler, symbol);
      REQUIRE(info.ok());
      CHECK(info->api_major == XLA_FFI_API_MAJOR);
      CHECK(info->api_minor == XLA_FFI_API_MINOR);
      CHECK(info->traits == 0);
    }
  }
}

TEST_CASE("The CUDA modules export only their handlers", "[cuda_kernels]") {
  void* lib = Open("libdemo_cuda.so");
  for (const char* hidden : {"cudaMalloc", "cudaLaunchKernel",
                             "cudaGetLastError", "CsrEventMatvec"}) {
    INFO(hidden);
    CHECK(dlsym(lib, hidden) == nullptr);
  }
}

TEST_CASE("Fail returns its message on the cuda platform", "[cuda_kernels]") {
  void* fail = dlsym(Open("libdemo_cuda.so"), "Fail");
  std::vector<float> x(2);
  LaunchFrame frame;
  frame.platform = Platform::kCuda;
  frame.args.push_back(BufferRef{XLA_FFI_DataType_F32, {2}, x.data()});
  Attr code;
  code.kind = Attr::Kind::kScalar;
  code.dtype = XLA_FFI_DataType_S64;
  int64_t value = 42;
  code.bytes.assign(reinterpret_cast<const char*>(&value), sizeof(value));
  frame.attrs.push_back({"code", code});
  FfiHost host;
  absl::Status s = host.Execute(fail, frame);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "demo.Fail: refused on purpose (code=42)");
}

TEST_CASE("A CUDA handler without a stream fails cleanly", "[cuda_kernels]") {
  void* scale = dlsym(Open("libdemo_cuda.so"), "Scale");
  std::vector<float> x(4), y(4);
  LaunchFrame frame;
  frame.platform = Platform::kCuda;
  frame.args.push_back(BufferRef{XLA_FFI_DataType_F32, {4}, x.data()});
  frame.rets.push_back(BufferRef{XLA_FFI_DataType_F32, {4}, y.data()});
  Attr factor;
  factor.kind = Attr::Kind::kScalar;
  factor.dtype = XLA_FFI_DataType_F32;
  float f = 2.0f;
  factor.bytes.assign(reinterpret_cast<const char*>(&f), sizeof(f));
  frame.attrs.push_back({"factor", factor});
  FfiHost host;
  absl::Status s = host.Execute(scale, frame);  // CallOptions without stream
  CHECK_FALSE(s.ok());
  CHECK(std::string(s.message()).find("no stream is available") !=
        std::string::npos);
}

}  // namespace
}  // namespace kreg
