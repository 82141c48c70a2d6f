// Wraps UCX status codes into absl::Status, once, naming the call that failed.
#pragma once

#include <ucs/type/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tributary::dataplane::ucx {

// The absl code that best matches a UCX status (e.g. UCS_ERR_UNREACHABLE -> UNAVAILABLE,
// UCS_ERR_CANCELED -> CANCELLED, UCS_ERR_INVALID_PARAM -> INVALID_ARGUMENT).
absl::StatusCode ToStatusCode(ucs_status_t status);

// OK for UCS_OK; otherwise a status with the mapped code and the message "`call`: <ucx reason>".
absl::Status ToStatus(ucs_status_t status, absl::string_view call);

}  // namespace tributary::dataplane::ucx
