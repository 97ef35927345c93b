#include "daemon/supervisor/gpu_sharing.h"

#include "absl/strings/str_cat.h"

namespace kreg {

GpuSharing DescribeGpuSharing(const absl::Status& cuda, const MpsControl& mps) {
  if (!cuda.ok()) {
    return {"none",
            absl::StrCat("no GPU: ", cuda.message(), " (", mps.detail, ")")};
  }
  return {mps.live ? "mps" : "time-sliced", mps.detail};
}

std::string GpuSharingWarning(const GpuSharing& sharing,
                              const MpsControl& mps) {
  if (sharing.mode != "time-sliced") return "";
  return absl::StrCat(
      "GPU sharing: time-sliced (", mps.detail,
      "). Each client's and its executor's CUDA contexts take turns on the "
      "GPU, so a small forwarded CUDA call can take ~450 us instead of "
      "~100 us in runs of slow calls. Run the CUDA MPS control daemon for "
      "the fast path: `systemctl enable --now nvidia-mps.service` (shipped "
      "as daemon/systemd/nvidia-mps.service), with the same "
      "CUDA_MPS_PIPE_DIRECTORY for kregd and its clients (kregd looks in ",
      mps.pipe_dir,
      "), then restart kregd. Under MPS a fatal GPU fault can take down every "
      "client of that MPS server (docs/operator-guide.md, GPU sharing)");
}

}  // namespace kreg
