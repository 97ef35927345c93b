#include "common/stage_trace.h"

namespace kreg {
namespace stage {

namespace {
thread_local Times* t_stage = nullptr;
}  // namespace

Times* Current() { return t_stage; }
void SetCurrent(Times* times) { t_stage = times; }

}  // namespace stage
}  // namespace kreg
