// Content-addressed store of kernel modules: <dir>/sha256-<hex>.so.
#ifndef KREGD_DAEMON_STORE_MODULE_STORE_H_
#define KREGD_DAEMON_STORE_MODULE_STORE_H_

#include <fcntl.h>

#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/base/sha256.h"  // Sha256Digest

namespace kreg {

// The seals a module memfd handed to a client carries (DESIGN §11).
inline constexpr int kLocalModuleSeals =
    F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

// Owns the store directory. kregd never loads a module itself: executors
// (and the probe) get the store copies (DESIGN §8). Thread-safe.
class ModuleStore {
 public:
  explicit ModuleStore(std::string dir);
  ModuleStore(const ModuleStore&) = delete;
  ModuleStore& operator=(const ModuleStore&) = delete;

  // Creates the directory (mode 0700) if missing and removes temp files
  // left by a crash during a registration. INTERNAL on failure.
  absl::Status Init();

  // Writes `bytes` (whose Sha256Digest, computed by the caller, is
  // `digest`) to a fsynced temp file in the store directory that is not a
  // store entry yet; returns its path. INTERNAL on I/O failure.
  absl::StatusOr<std::string> WriteTemp(const std::string& bytes,
                                        const std::string& digest);
  // Renames a WriteTemp file to the store path of `digest`, fsyncs the
  // directory.
  absl::Status CommitTemp(const std::string& temp_path,
                          const std::string& digest);

  // WriteTemp + CommitTemp, unless an intact copy is already there.
  absl::Status Put(const std::string& bytes, const std::string& digest);

  // Removes the store file of every digest not in `keep` and every temp
  // file; other files are left alone. Counts in `*files`/`*bytes` what was
  // removed and in `*kept_files`/`*kept_bytes` what stays.
  absl::Status RemoveUnreferenced(const std::set<std::string>& keep,
                                  uint64_t* files, uint64_t* bytes,
                                  uint64_t* kept_files, uint64_t* kept_bytes);

  // The store path of `digest` ("sha256:<hex>").
  std::string PathOf(const std::string& digest) const;

  // Local execution (DESIGN §11): a memfd holding the stored bytes of
  // `digest`, re-hashed after the copy (DATA_LOSS naming the file when they
  // do not match) and sealed with kLocalModuleSeals, so its holder can neither
  // change it nor be handed something else. Copied in the kernel (no heap
  // buffer of the module's size). RESOURCE_EXHAUSTED when the file is
  // larger than `max_bytes`. `tamper_for_test` flips the copy's last byte
  // before sealing (the shim's digest check is tested with it).
  absl::StatusOr<UniqueFd> SealedCopy(const std::string& digest,
                                      uint64_t max_bytes,
                                      bool tamper_for_test = false) const;

  // Re-hashes the stored file. NOT_FOUND if missing, DATA_LOSS if its bytes
  // no longer match the digest.
  absl::Status Verify(const std::string& digest) const;

 private:
  const std::string dir_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_STORE_MODULE_STORE_H_
