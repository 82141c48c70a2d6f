// The intra-node executors' tests' node: "GPUs" of HostGpuOps, each with a buffer of small
// integers (exact in every dtype and in every sum order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "dataplane/intranode/host_gpu_ops.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "tests/util/typed_values.h"

namespace tributary::testing {

// GPU g's input at element i.
inline double Input(int g, size_t i, int scale) {
  return scale * (static_cast<double>((i * 7 + g * 3) % 11) - 5);
}

class Node {
 public:
  Node(int gpus, common::DataType dtype, size_t count, int scale,
       dataplane::HostGpuOps::Options options = {})
      : ops_(gpus, reducer_, options), buffers_(gpus) {
    const size_t size = common::DataTypeSize(dtype);
    for (int g = 0; g < gpus; ++g) {
      buffers_[g].resize(count * size);
      for (size_t i = 0; i < count; ++i) {
        PutValue(dtype, buffers_[g].data(), i, Input(g, i, scale));
      }
      ops_.RegisterBuffer(g, buffers_[g].data(), buffers_[g].size());
      pointers_.push_back(buffers_[g].data());
    }
  }
  dataplane::HostGpuOps& ops() { return ops_; }
  dataplane::ScalarReducer& reducer() { return reducer_; }
  std::vector<void*>& pointers() { return pointers_; }
  const uint8_t* buffer(int g) const { return buffers_[g].data(); }

 private:
  dataplane::ScalarReducer reducer_;
  dataplane::HostGpuOps ops_;
  std::vector<std::vector<uint8_t>> buffers_;
  std::vector<void*> pointers_;
};

}  // namespace tributary::testing
