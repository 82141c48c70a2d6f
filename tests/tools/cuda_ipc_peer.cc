// The other process of tests/dataplane/cuda/cuda_ipc_test.cc: opens the CUDA IPC buffer whose
// hex-encoded record is argv[1], waits for the exporter's ready event, checks the int32 values
// i * 3 + 1 it must hold, negates them in place and exits 0; prints the reason and exits 1
// otherwise.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dataplane/cuda/cuda_ipc.h"

int main(int argc, char** argv) {
  using namespace tributary::dataplane::cuda;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <hex CudaIpcBuffer record>\n", argv[0]);
    return 2;
  }
  const std::string hex = argv[1];
  std::string record;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    record.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  absl::StatusOr<CudaIpcBuffer> buffer = ParseCudaIpcBuffer(record);
  if (!buffer.ok()) {
    std::fprintf(stderr, "peer: %s\n", buffer.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<CudaIpcImport>> in = CudaIpcImport::Open(*buffer);
  if (!in.ok()) {
    std::fprintf(stderr, "peer: %s\n", in.status().ToString().c_str());
    return 1;
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess || !(*in)->WaitReady(stream).ok()) {
    std::fprintf(stderr, "peer: cannot order a stream after the ready event\n");
    return 1;
  }
  const size_t count = (*in)->bytes() / 4;
  std::vector<int32_t> v(count);
  if (cudaMemcpyAsync(v.data(), (*in)->data(), count * 4, cudaMemcpyDeviceToHost, stream) !=
          cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    std::fprintf(stderr, "peer: reading the buffer failed\n");
    return 1;
  }
  for (size_t i = 0; i < count; ++i) {
    if (v[i] != static_cast<int32_t>(i * 3 + 1)) {
      std::fprintf(stderr, "peer: element %zu is %d, want %zu\n", i, v[i], i * 3 + 1);
      return 1;
    }
    v[i] = -v[i];
  }
  if (cudaMemcpy((*in)->data(), v.data(), count * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
    std::fprintf(stderr, "peer: writing the buffer failed\n");
    return 1;
  }
  cudaStreamDestroy(stream);
  std::printf("ok\n");
  return 0;
}
