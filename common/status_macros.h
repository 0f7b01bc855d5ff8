// Small absl::Status helpers that Abseil 20220623 does not ship.
#ifndef DP_COMMON_STATUS_MACROS_H_
#define DP_COMMON_STATUS_MACROS_H_

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DP_CONCAT_INNER_(a, b) a##b
#define DP_CONCAT_(a, b) DP_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` yields a non-OK status.
#define RETURN_IF_ERROR(expr)                                \
  do {                                                       \
    ::absl::Status dp_status_ = (expr);                      \
    if (!dp_status_.ok()) return dp_status_;                 \
  } while (0)

// ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define ASSIGN_OR_RETURN(lhs, expr) \
  DP_ASSIGN_OR_RETURN_IMPL_(DP_CONCAT_(dp_statusor_, __LINE__), lhs, expr)
#define DP_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                              \
  if (!var.ok()) return std::move(var).status();  \
  lhs = std::move(var).value()

// Aborts with file:line for broken invariants (never for bad input).
#define DP_CHECK(cond)                                                   \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,        \
                   __LINE__, #cond);                                     \
      std::abort();                                                      \
    }                                                                    \
  } while (0)

#endif  // DP_COMMON_STATUS_MACROS_H_
