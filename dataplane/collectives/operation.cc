#include "dataplane/collectives/operation.h"

#include "common/hash.h"
#include "dataplane/collectives/job_view.h"

namespace tributary::dataplane {

std::string_view ReductionName(Reduction r) {
  switch (r) {
    case Reduction::kSum:
      return "sum";
    case Reduction::kAverage:
      return "average";
    case Reduction::kBroadcast:
      return "broadcast";
    case Reduction::kAllGather:
      return "allgather";
    case Reduction::kReduceScatterSum:
      return "reduce_scatter_sum";
    case Reduction::kReduceScatterAverage:
      return "reduce_scatter_average";
  }
  return "unknown";
}

bool IsValidReduction(uint32_t raw) { return raw >= 1 && raw <= 6; }

bool IsBlockwise(Reduction r) { return r == Reduction::kAllGather || IsReduceScatter(r); }

bool IsReduceScatter(Reduction r) {
  return r == Reduction::kReduceScatterSum || r == Reduction::kReduceScatterAverage;
}

uint64_t JobView::job_hash() const { return common::StableHash64(job_id); }

}  // namespace tributary::dataplane
