// CudaReducer: the Reducer interface on a CUDA device, plus k-source and asynchronous passes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "dataplane/reduce/reducer.h"

namespace tributary::dataplane {

// Reductions by the kernels of reduce_kernels.cu on one CUDA device, with the bits of
// ScalarReducer (dataplane/reduce/README.md, "Numerics"): each addition rounds to the element
// type in source order, NaN results are canonical, integers wrap.
//
// Pointers are device-accessible memory of the reducer's device: device memory, managed memory,
// or pinned/registered host memory (pageable host memory only where the device can access it,
// e.g. with HMM); anything else is INVALID_ARGUMENT. Any alignment; vectorised 16-byte loads when
// every pointer of a call has the same offset modulo 16. `dst` equals a source or overlaps none.
//
// Thread-safe: no mutable state after Create. The Reducer overrides run on the calling thread's
// per-thread default stream and block until done (a CUDA failure there, which that interface
// cannot return, is logged and aborts: after a failed kernel the CUDA context is unusable); the
// *Async calls enqueue on the caller's stream and return at once.
class CudaReducer final : public Reducer {
 public:
  // FAILED_PRECONDITION "no CUDA device ..." without a driver or device; INVALID_ARGUMENT for a
  // device ordinal that does not exist.
  static absl::StatusOr<std::unique_ptr<CudaReducer>> Create(int device = 0);

  int device() const { return device_; }

  // dst[i] = srcs[0][i] + srcs[1][i] + ... (left to right) for i in [0, count); with `average`,
  // then divided by srcs.size(). Any number of sources >= 1 (8 per kernel pass; more are
  // chained, dst accumulating, with the same bits; dst may then be one of the first 8 only).
  // Enqueued on `stream` (of this device).
  absl::Status ReduceAsync(common::DataType dtype, void* dst, std::span<const void* const> srcs,
                           size_t count, bool average, cudaStream_t stream) const;
  // dst[i] /= divisor (divisor >= 1), enqueued on `stream`.
  absl::Status DivideAsync(common::DataType dtype, void* dst, size_t count, uint64_t divisor,
                           cudaStream_t stream) const;

  // Reducer, synchronous (see the class comment).
  void Sum(common::DataType dtype, void* dst, const void* src, size_t count) override;
  void Sum2(common::DataType dtype, void* dst, const void* a, const void* b, size_t count) override;
  void Divide(common::DataType dtype, void* dst, size_t count, uint64_t divisor) override;

 private:
  CudaReducer(int device, int max_blocks, bool pageable_access)
      : device_(device), max_blocks_(max_blocks), pageable_access_(pageable_access) {}

  absl::Status CheckPointer(const void* p, const char* what) const;
  absl::Status Pass(common::DataType dtype, void* dst, std::span<const void* const> srcs,
                    size_t count, bool divide, uint64_t divisor, cudaStream_t stream) const;
  void Synchronous(const char* what, absl::Status enqueued);

  int device_;
  int max_blocks_;        // Grid-size cap: enough resident blocks to fill every SM.
  bool pageable_access_;  // The device reads pageable host memory (HMM, ATS).
};

}  // namespace tributary::dataplane
