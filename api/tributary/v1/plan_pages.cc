#include "tributary/v1/plan_pages.h"

#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/coded_stream.h"

namespace tributary::v1 {
namespace {

// Bytes an entry adds to a reply: its own, its length prefix and its tag.
template <typename Message>
size_t EntryBytes(const Message& m) {
  const size_t size = m.ByteSizeLong();
  return size + google::protobuf::io::CodedOutputStream::VarintSize64(size) + 2;
}

// The three lists, swapped out of a plan and back.
struct Lists {
  google::protobuf::RepeatedPtrField<WorkerNode> workers;
  google::protobuf::RepeatedPtrField<IntraNodePlan> intra_node;
  google::protobuf::RepeatedPtrField<SummationServer> servers;

  void Swap(JobPlan& plan) {
    workers.Swap(plan.mutable_workers());
    intra_node.Swap(plan.mutable_intra_node());
    servers.Swap(plan.mutable_servers());
  }
};

}  // namespace

uint32_t PlanEntries(const JobPlan& plan) {
  return static_cast<uint32_t>(plan.workers_size() + plan.intra_node_size() + plan.servers_size());
}

std::string EncodePlanPageToken(const PlanPageToken& token) {
  return absl::StrCat("v", token.version, ".", token.first);
}

absl::StatusOr<PlanPageToken> DecodePlanPageToken(std::string_view token_text) {
  absl::string_view text(token_text.data(), token_text.size());
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        "plan_page_token is not one GetJob, CreateJob or ListJobs returned; pass "
        "plan_page.next_token as it was, or none for the first page");
  };
  if (text.size() > 64 || !absl::ConsumePrefix(&text, "v")) return bad();
  const std::vector<absl::string_view> parts = absl::StrSplit(text, '.');
  PlanPageToken token;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &token.version) ||
      !absl::SimpleAtoi(parts[1], &token.first) || token.version == 0) {
    return bad();
  }
  return token;
}

size_t CopyJobPage(Job& job, uint32_t first, size_t budget, bool continuable, Job* out) {
  JobPlan& plan = *job.mutable_plan();
  Lists lists;
  lists.Swap(plan);
  *out = job;  // everything but the lists
  lists.Swap(plan);
  out->clear_plan_page();
  JobPlan& page = *out->mutable_plan();
  const uint32_t w = plan.workers_size(), i = plan.intra_node_size(), s = plan.servers_size();
  const uint32_t total = w + i + s;
  size_t bytes = 0;
  uint32_t e = first;
  for (; e < total && (e == first || bytes < budget); ++e) {
    if (e < w) {
      bytes += EntryBytes(plan.workers(e));
      *page.add_workers() = plan.workers(e);
    } else if (e < w + i) {
      bytes += EntryBytes(plan.intra_node(e - w));
      *page.add_intra_node() = plan.intra_node(e - w);
    } else {
      bytes += EntryBytes(plan.servers(e - w - i));
      *page.add_servers() = plan.servers(e - w - i);
    }
  }
  if (first > 0 || e < total) {
    PlanPage& info = *out->mutable_plan_page();
    info.set_first(first);
    info.set_count(e - first);
    info.set_total(total);
    if (e < total && continuable) {
      info.set_next_token(EncodePlanPageToken({.version = plan.version(), .first = e}));
    }
  }
  return bytes;
}

absl::Status AppendPlanPage(Job& job, Job page) {
  const uint64_t have = PlanEntries(job.plan());
  if (page.plan().version() != job.plan().version()) {
    return absl::AbortedError(absl::StrCat("job '", job.job_id(), "' was re-planned (version ",
                                           job.plan().version(), " -> ", page.plan().version(),
                                           ") while its plan was read in pages; read it again"));
  }
  if (page.job_id() != job.job_id() || !page.has_plan_page() || page.plan_page().first() != have ||
      page.plan_page().count() != PlanEntries(page.plan())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a page of job '", page.job_id(), "' does not continue job '", job.job_id(),
                     "' at entry ", have, " (it starts at ", page.plan_page().first(), ")"));
  }
  JobPlan& plan = *job.mutable_plan();
  JobPlan& rest = *page.mutable_plan();
  for (auto& x : *rest.mutable_workers()) *plan.add_workers() = std::move(x);
  for (auto& x : *rest.mutable_intra_node()) *plan.add_intra_node() = std::move(x);
  for (auto& x : *rest.mutable_servers()) *plan.add_servers() = std::move(x);
  *job.mutable_plan_page() = page.plan_page();
  if (page.plan_page().next_token().empty()) job.clear_plan_page();
  return absl::OkStatus();
}

absl::StatusOr<Job> ReadRestOfPlan(
    Job first, const std::function<absl::StatusOr<Job>(const std::string&)>& get_page) {
  // Bounded: every page holds at least one entry, so a plan of E entries has at most E pages.
  for (uint32_t pages = 0; !first.plan_page().next_token().empty(); ++pages) {
    if (pages > first.plan_page().total()) {
      return absl::InternalError(
          absl::StrCat("job '", first.job_id(), "': more pages than entries"));
    }
    absl::StatusOr<Job> page = get_page(first.plan_page().next_token());
    if (!page.ok()) return page.status();
    if (absl::Status s = AppendPlanPage(first, *std::move(page)); !s.ok()) return s;
  }
  return first;
}

}  // namespace tributary::v1
