// Early returns of an absl::Status, the way XLA and leveldb write them:
// one line where a failed step ends the function with its error.
//
//   KREG_RETURN_IF_ERROR(store_.Commit(staged));
//   KREG_ASSIGN_OR_RETURN(HandlerInfo info, loader_->Probe(staged, func));
//
// The expression is evaluated once; its error is returned unchanged (the
// caller adds context where a person needs it, not here).
//
// libc only, like the rest of //common, so the client side uses it too:
// KREG_RETURN_IF_ERROR takes the status type the function returns
// (absl::Status in kregd and its helpers, kreg::ClientStatus from
// common/status.h in the shim); KREG_ASSIGN_OR_RETURN takes an
// absl::StatusOr<T>, whose header its caller includes.
#ifndef KREGD_COMMON_STATUS_MACROS_H_
#define KREGD_COMMON_STATUS_MACROS_H_

#include <utility>

#define KREG_RETURN_IF_ERROR(expr)                        \
  do {                                                    \
    if (auto kreg_status_ = (expr); !kreg_status_.ok()) { \
      return kreg_status_;                                \
    }                                                     \
  } while (0)

// `lhs` is a declaration (`T name`) or an lvalue; `expr` an
// absl::StatusOr<T>. A `lhs` with a comma needs parentheses around its type
// or an alias.
#define KREG_ASSIGN_OR_RETURN(lhs, expr)                                    \
  KREG_ASSIGN_OR_RETURN_IMPL_(KREG_STATUS_CONCAT_(kreg_or_, __LINE__), lhs, \
                              expr)

#define KREG_STATUS_CONCAT_INNER_(a, b) a##b
#define KREG_STATUS_CONCAT_(a, b) KREG_STATUS_CONCAT_INNER_(a, b)
#define KREG_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = *std::move(tmp)

#endif  // KREGD_COMMON_STATUS_MACROS_H_
