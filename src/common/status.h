#pragma once
// Error handling for all of Tandem: absl::Status / absl::StatusOr<T>.
// Running out of capacity is a normal result, not an error; Status is for
// things that went wrong. These macros keep call sites short.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_CONCAT_INNER_(a, b) a##b
#define TANDEM_CONCAT_(a, b) TANDEM_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (a Status) is not OK.
#define TANDEM_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::absl::Status tandem_status_ = (expr);           \
    if (!tandem_status_.ok()) return tandem_status_;  \
  } while (0)

// `lhs` = value of `expr` (a StatusOr<T>), or returns its Status.
#define TANDEM_ASSIGN_OR_RETURN(lhs, expr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(TANDEM_CONCAT_(tandem_statusor_, __LINE__), lhs, expr)
#define TANDEM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
