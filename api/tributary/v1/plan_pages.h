// How job replies (CreateJob, GetJob, ListJobs) carry a plan in pages (controller.proto,
// PlanPage): the controller cuts, the clients read the rest with GetJob and put the pages back
// together. A 4,096-worker plan is ~4.4 MB; no reply carries more than about kPlanPageBytes of
// its per-node lists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::v1 {

// About the most bytes of plan lists in one reply (an entry larger than that travels alone).
inline constexpr size_t kPlanPageBytes = size_t{1} << 20;

// Entries of the plan's lists, numbered as PlanPage says: workers, intra_node, servers.
uint32_t PlanEntries(const JobPlan& plan);

// GetJobRequest.plan_page_token: the plan version it belongs to and the page's first entry.
struct PlanPageToken {
  uint64_t version = 0;
  uint32_t first = 0;
};
std::string EncodePlanPageToken(const PlanPageToken& token);
// INVALID_ARGUMENT (a message the caller can act on) for text EncodePlanPageToken did not write.
absl::StatusOr<PlanPageToken> DecodePlanPageToken(std::string_view text);

// Copies `job` into `out` (replaced) with the plan's lists from entry `first` on, up to about
// `budget` bytes of them (at least one entry while any remain). When that is not the whole plan,
// out->plan_page says which part it is, with a next token when `continuable` (a stored job, not
// a dry run). `job`'s lists are moved out and back (O(1)): it is left as it was, and only the
// page is copied, so the cost does not grow with the plan. Returns the page's bytes of lists.
size_t CopyJobPage(Job& job, uint32_t first, size_t budget, bool continuable, Job* out);

// Appends `page`'s lists to `job`, which holds the pages before it (the first page: `job` is
// it). ABORTED when `page` is of another plan version, INVALID_ARGUMENT when it does not start
// where `job` ends; `job` is then unchanged.
absl::Status AppendPlanPage(Job& job, Job page);

// Reads the rest of a job whose reply was one page: `get_page(token)` is one GetJob call with
// that plan_page_token. Returns `first` whole (unchanged when it already was); an error of
// get_page as it came (ABORTED: re-planned meanwhile, start again). A dry run's cut preview is
// returned as it is (it has no next token).
absl::StatusOr<Job> ReadRestOfPlan(
    Job first, const std::function<absl::StatusOr<Job>(const std::string&)>& get_page);

}  // namespace tributary::v1
