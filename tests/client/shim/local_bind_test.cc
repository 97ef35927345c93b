#include "client/shim/local_bind.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include "catch2/catch.hpp"
#include "common/sha256.h"

namespace kreg {
namespace shim {
namespace {

constexpr int kAllSeals =
    F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

std::string ReadRunfile(const std::string& relative) {
  std::ifstream in(relative, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), {}};
}

UniqueFd Memfd(const std::string& bytes, int seals) {
  UniqueFd fd(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd.ok());
  REQUIRE(::write(fd.get(), bytes.data(), bytes.size()) ==
          static_cast<ssize_t>(bytes.size()));
  if (seals != 0) REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, seals) == 0);
  return fd;
}

v1::Target Info(const std::string& bytes, const std::string& func) {
  v1::Target t;
  t.set_target_name("demo.local");
  t.set_platform("cpu");
  t.set_func_name(func);
  t.set_module_size(bytes.size());
  t.set_module_digest(Sha256Hex(bytes.data(), bytes.size()));
  return t;
}

TEST_CASE("CheckModuleFd accepts exactly the registered, sealed bytes",
          "[shim][local]") {
  const std::string bytes = "not really a module, but 40 bytes long..";
  CHECK(CheckModuleFd(Memfd(bytes, kAllSeals).get(), Info(bytes, "F")).ok());
}

TEST_CASE("CheckModuleFd refuses what could change or is not the module",
          "[shim][local]") {
  const std::string bytes = "module bytes";
  const v1::Target info = Info(bytes, "F");
  SECTION("unsealed") {
    ClientStatus s = CheckModuleFd(Memfd(bytes, 0).get(), info);
    CHECK(s.code == kFailedPrecondition);
    CHECK(s.message ==
          "kreg: the module kregd handed out for \"demo.local\" (cpu) is not "
          "sealed against changes (seals 0), so it could change after the "
          "check; nothing was loaded");
  }
  SECTION("sealed against shrinking only") {
    ClientStatus s = CheckModuleFd(Memfd(bytes, F_SEAL_SHRINK).get(), info);
    CHECK(s.code == kFailedPrecondition);
  }
  SECTION("another size") {
    v1::Target bigger = info;
    bigger.set_module_size(bytes.size() + 1);
    ClientStatus s = CheckModuleFd(Memfd(bytes, kAllSeals).get(), bigger);
    CHECK(s.code == kDataLoss);
    CHECK(s.message ==
          "kreg: the module kregd handed out for \"demo.local\" (cpu) has 12 "
          "bytes, not the registered 13; nothing was loaded");
  }
  SECTION("other bytes of the same size") {
    ClientStatus s =
        CheckModuleFd(Memfd("MODULE BYTES", kAllSeals).get(), info);
    CHECK(s.code == kDataLoss);
    CHECK_THAT(
        s.message,
        Catch::StartsWith("kreg: the module kregd handed out for "
                          "\"demo.local\" (cpu) has digest sha256:") &&
            Catch::Contains(", not the registered " + info.module_digest() +
                            "; it was not loaded"));
  }
  SECTION("not a file") {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    ClientStatus s = CheckModuleFd(p[0], info);
    ::close(p[0]);
    ::close(p[1]);
    CHECK(s.code == kFailedPrecondition);
    CHECK_THAT(s.message, Catch::Contains("not a module file"));
  }
}

TEST_CASE("LoadModule runs the genuine handler from a memfd", "[shim][local]") {
  const std::string bytes = ReadRunfile("kernels/cpu/libdemo.so");
  UniqueFd fd = Memfd(bytes, kAllSeals);
  const int raw = fd.get();
  void* handler = nullptr;
  void* library = nullptr;
  ClientStatus s =
      LoadModule(std::move(fd), Info(bytes, "Scale"), &handler, &library);
  INFO(s.message);
  REQUIRE(s.ok());
  CHECK(handler != nullptr);
  CHECK(library != nullptr);
  CHECK(::fcntl(raw, F_GETFD) >= 0);  // kept open for the process's life
  CHECK(handler == ::dlsym(library, "Scale"));
}

TEST_CASE("LoadModule names a missing symbol and an unloadable module",
          "[shim][local]") {
  const std::string bytes = ReadRunfile("kernels/cpu/libdemo.so");
  void* handler = nullptr;
  ClientStatus s = LoadModule(Memfd(bytes, kAllSeals),
                              Info(bytes, "NoSuchHandler"), &handler);
  CHECK(s.code == kNotFound);
  CHECK_THAT(s.message, Catch::Contains("has no symbol \"NoSuchHandler\""));
  const std::string junk(4096, '\x7f');
  s = LoadModule(Memfd(junk, kAllSeals), Info(junk, "Scale"), &handler);
  CHECK(s.code == kInternal);
  CHECK_THAT(s.message,
             Catch::StartsWith("kreg: cannot load the module of "
                               "\"demo.local\" (cpu) (sha256:") &&
                 Catch::Contains("Run it isolated (execution=\"isolated\") "
                                 "instead"));
}

}  // namespace
}  // namespace shim
}  // namespace kreg
