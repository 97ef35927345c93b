#include "client/shim/cuda_trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

namespace kreg {
namespace shim {

namespace {

// KREG_TRACE_CUDA=1 (stderr) or =PATH (appended): one line per step of each
// forwarded CUDA call, flushed at once, so the last line before a crash says
// how far a call got.
FILE* TraceFile() {
  static FILE* const file = []() -> FILE* {
    const char* v = getenv("KREG_TRACE_CUDA");
    if (v == nullptr || *v == 0 || strcmp(v, "0") == 0) return nullptr;
    if (strcmp(v, "1") == 0 || strcmp(v, "stderr") == 0) return stderr;
    FILE* f = fopen(v, "ae");
    return f != nullptr ? f : stderr;
  }();
  return file;
}

}  // namespace

__attribute__((format(printf, 1, 2))) void Trace(const char* fmt, ...) {
  FILE* f = TraceFile();
  if (f == nullptr) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  fprintf(f, "kreg-cuda[%d] %s\n", static_cast<int>(getpid()), line);
  fflush(f);
}

bool Tracing() { return TraceFile() != nullptr; }

}  // namespace shim
}  // namespace kreg
