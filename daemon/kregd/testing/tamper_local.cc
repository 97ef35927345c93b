// The local-execution digest test's kregd
// (tests/python/test_local_execution.py): corrupts every module it hands out
// for local execution, so the shim must refuse to load it. Overrides the weak
// definition in server.cc.
#include "daemon/kregd/server.h"

namespace kreg {

bool TamperLocalModulesForTest() { return true; }

}  // namespace kreg
