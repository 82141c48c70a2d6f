#include "dataplane/transport/ucx/ucx_status.h"

#include "absl/strings/str_cat.h"

namespace tributary::dataplane::ucx {

absl::StatusCode ToStatusCode(ucs_status_t status) {
  switch (status) {
    case UCS_OK:
      return absl::StatusCode::kOk;
    case UCS_ERR_CANCELED:
      return absl::StatusCode::kCancelled;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::StatusCode::kInvalidArgument;
    case UCS_ERR_TIMED_OUT:
      return absl::StatusCode::kDeadlineExceeded;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
    case UCS_ERR_OUT_OF_RANGE:
      return absl::StatusCode::kResourceExhausted;
    case UCS_ERR_UNSUPPORTED:
      return absl::StatusCode::kUnimplemented;
    case UCS_ERR_BUSY:
    case UCS_ERR_ALREADY_EXISTS:
      return absl::StatusCode::kFailedPrecondition;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_RESOURCE:
      return absl::StatusCode::kUnavailable;
    default:
      // A dead link or endpoint (including UCS_ERR_ENDPOINT_TIMEOUT) means the peer is gone.
      if (UCS_IS_LINK_ERROR(status) || UCS_IS_ENDPOINT_ERROR(status)) {
        return absl::StatusCode::kUnavailable;
      }
      return absl::StatusCode::kInternal;
  }
}

absl::Status ToStatus(ucs_status_t status, absl::string_view call) {
  if (status == UCS_OK) return absl::OkStatus();
  return absl::Status(ToStatusCode(status), absl::StrCat(call, ": ", ucs_status_string(status)));
}

}  // namespace tributary::dataplane::ucx
