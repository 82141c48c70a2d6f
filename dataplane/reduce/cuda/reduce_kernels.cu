// The reduction kernels: one grid-stride kernel per element type and load mode, and for 16-byte
// vectors a second one that takes two vectors per step for the passes TakesPairs picks (24 in
// all; the number of sources and the division are arguments).
#include "dataplane/reduce/cuda/reduce_kernels.h"

namespace tributary::dataplane::cuda_reduce {
namespace {

constexpr int kThreadsPerBlock = 256;

template <typename Op, LoadMode M, bool Pair = false>
__global__ void __launch_bounds__(kThreadsPerBlock) ReduceKernel(ReduceArgs args) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  ReduceThread<Op, M, Pair>(args, tid, threads);
}

}  // namespace

cudaError_t LaunchReduce(ElementType t, const ReduceArgs& args, int max_blocks,
                         cudaStream_t stream) {
  if (args.count == 0) return cudaSuccess;
  const size_t element_size = ElementSize(t);
  const LoadMode mode = SelectLoadMode(args, element_size);
  const size_t items = WorkItems(args, element_size, mode);
  size_t blocks = (items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  if (blocks > static_cast<size_t>(max_blocks)) blocks = static_cast<size_t>(max_blocks);
  if (blocks == 0) blocks = 1;
  const dim3 grid(static_cast<unsigned>(blocks));
  DispatchElementType(t, [&]<typename Op>() {
    switch (mode) {
      case LoadMode::kVector16:
        if (TakesPairs(args)) {
          ReduceKernel<Op, LoadMode::kVector16, true><<<grid, kThreadsPerBlock, 0, stream>>>(args);
        } else {
          ReduceKernel<Op, LoadMode::kVector16><<<grid, kThreadsPerBlock, 0, stream>>>(args);
        }
        break;
      case LoadMode::kElement:
        ReduceKernel<Op, LoadMode::kElement><<<grid, kThreadsPerBlock, 0, stream>>>(args);
        break;
      case LoadMode::kBytes:
        ReduceKernel<Op, LoadMode::kBytes><<<grid, kThreadsPerBlock, 0, stream>>>(args);
        break;
    }
  });
  return cudaGetLastError();
}

}  // namespace tributary::dataplane::cuda_reduce
