// main() for the fuzz targets when built without libFuzzer (the default
// toolchain, gcc): runs LLVMFuzzerTestOneInput once on each file named on
// the command line (directories: each file in them), e.g. a seed corpus or a
// crash reproducer. Exits non-zero if an argument cannot be read.
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc,
                                                          char*** argv);

namespace {

bool RunFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                         bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  bool ok = true;
  int runs = 0;
  for (int i = 1; i < argc; ++i) {
    struct stat st;
    if (::stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
      DIR* dir = ::opendir(argv[i]);
      std::vector<std::string> files;
      while (dirent* e = dir ? ::readdir(dir) : nullptr) {
        if (e->d_name[0] != '.')
          files.push_back(argv[i] + ("/" + std::string(e->d_name)));
      }
      if (dir) ::closedir(dir);
      for (const std::string& f : files) ok &= RunFile(f), ++runs;
    } else {
      ok &= RunFile(argv[i]);
      ++runs;
    }
  }
  std::printf("replayed %d inputs\n", runs);
  return ok ? 0 : 1;
}
