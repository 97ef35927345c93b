// A temporary directory removed (recursively) at scope exit.
#ifndef KREGD_TESTS_TESTING_TEMP_DIR_H_
#define KREGD_TESTS_TESTING_TEMP_DIR_H_

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kreg::testing {

class TempDir {
 public:
  TempDir() {
    // Not $TEST_TMPDIR: Unix socket paths must stay under 108 bytes.
    std::string tmpl = "/tmp/kreg-test-XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kreg::testing

#endif  // KREGD_TESTS_TESTING_TEMP_DIR_H_
