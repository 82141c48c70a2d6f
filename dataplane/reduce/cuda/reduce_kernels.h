// The CUDA reduction kernels' per-thread work, written once for the device and the host.
//
// reduce_kernels.cu runs `ReduceThread` as the body of a grid-stride kernel; the same code
// compiled by the host compiler (`ReduceOnHost`) runs every "thread" of a grid one after the
// other, so that the index math (aligned head, 16-byte vector body, tail), the load modes and the
// element arithmetic are tested on machines without a GPU (tests/dataplane/cuda). Internal to
// dataplane/reduce/cuda and its tests.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define TRIBUTARY_HD __host__ __device__
#else
#define TRIBUTARY_HD
#endif
// Unrolling for the device pass only (the host compiler does not know the pragma).
#ifdef __CUDA_ARCH__
#define TRIBUTARY_UNROLL _Pragma("unroll")
#else
#define TRIBUTARY_UNROLL
#endif

namespace tributary::dataplane::cuda_reduce {

// Sources one kernel pass folds; CudaReducer chains passes for more.
inline constexpr int kMaxSources = 8;

// Element types, in the kernels' own terms (the .cu files do not include common/, whose headers
// pull in Abseil).
enum class ElementType : uint8_t { kF32, kF64, kF16, kBf16, kI32, kI64 };

// One pass: dst[i] = (((src[0][i] + src[1][i]) + src[2][i]) + ...) for the first
// `num_sources` sources, then divided by `divisor` when `divide`. Each addition (and the
// division) rounds to the element type, so the bits equal ScalarReducer's Sum2/Sum/Divide
// applied in the same order. `dst` may be any of the sources (each element is read by the thread
// that writes it, before it writes it); otherwise buffers do not overlap.
struct ReduceArgs {
  void* dst = nullptr;
  const void* src[kMaxSources] = {};
  int num_sources = 0;  // 1..kMaxSources.
  bool divide = false;
  uint64_t divisor = 1;  // >= 1.
  size_t count = 0;      // Elements.
};

// How a pass loads: 16-byte vectors (all pointers share their offset modulo 16, and are
// element-aligned), one element at a time (element-aligned, offsets differ), or byte by byte
// (some pointer is not element-aligned; GPUs fault on misaligned typed loads).
enum class LoadMode : uint8_t { kVector16, kElement, kBytes };

inline LoadMode SelectLoadMode(const ReduceArgs& args, size_t element_size) {
  const uintptr_t phase = reinterpret_cast<uintptr_t>(args.dst) % 16;
  bool same_phase = true;
  bool aligned = phase % element_size == 0;
  for (int s = 0; s < args.num_sources; ++s) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(args.src[s]) % 16;
    same_phase = same_phase && p == phase;
    aligned = aligned && p % element_size == 0;
  }
  if (!aligned) return LoadMode::kBytes;
  return same_phase ? LoadMode::kVector16 : LoadMode::kElement;
}

// ---- Element arithmetic: the reference's (dataplane/reduce/cpu/scalar_ops.h), bit for bit.

TRIBUTARY_HD inline float CanonicalF32(float x) {
  if (x != x) {
    const uint32_t bits = 0x7FC00000u;
    float nan;
    memcpy(&nan, &bits, sizeof(nan));
    return nan;
  }
  return x;
}
TRIBUTARY_HD inline double CanonicalF64(double x) {
  if (x != x) {
    const uint64_t bits = 0x7FF8000000000000ull;
    double nan;
    memcpy(&nan, &bits, sizeof(nan));
    return nan;
  }
  return x;
}
TRIBUTARY_HD inline int64_t DivideTruncating(int64_t x, uint64_t divisor) {
  const bool negative = x < 0;
  const uint64_t magnitude = negative ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
  const uint64_t q = magnitude / divisor;
  return static_cast<int64_t>(negative ? 0 - q : q);
}
TRIBUTARY_HD inline float F16ToF32(uint16_t x) { return __half2float(__ushort_as_half(x)); }
TRIBUTARY_HD inline uint16_t F32ToF16(float x) {
  return x != x ? uint16_t{0x7E00} : __half_as_ushort(__float2half_rn(x));
}
TRIBUTARY_HD inline float Bf16ToF32(uint16_t x) {
  return __bfloat162float(__ushort_as_bfloat16(x));
}
TRIBUTARY_HD inline uint16_t F32ToBf16(float x) {
  return x != x ? uint16_t{0x7FC0} : __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

struct F32Op {
  using T = float;
  TRIBUTARY_HD static T Add(T a, T b) { return CanonicalF32(a + b); }
  TRIBUTARY_HD static T Divide(T x, uint64_t d) { return CanonicalF32(x / static_cast<float>(d)); }
};
struct F64Op {
  using T = double;
  TRIBUTARY_HD static T Add(T a, T b) { return CanonicalF64(a + b); }
  TRIBUTARY_HD static T Divide(T x, uint64_t d) { return CanonicalF64(x / static_cast<double>(d)); }
};
struct F16Op {
  using T = uint16_t;
  TRIBUTARY_HD static T Add(T a, T b) { return F32ToF16(F16ToF32(a) + F16ToF32(b)); }
  TRIBUTARY_HD static T Divide(T x, uint64_t d) {
    return F32ToF16(F16ToF32(x) / static_cast<float>(d));
  }
};
struct Bf16Op {
  using T = uint16_t;
  TRIBUTARY_HD static T Add(T a, T b) { return F32ToBf16(Bf16ToF32(a) + Bf16ToF32(b)); }
  TRIBUTARY_HD static T Divide(T x, uint64_t d) {
    return F32ToBf16(Bf16ToF32(x) / static_cast<float>(d));
  }
};
struct I32Op {
  using T = int32_t;
  TRIBUTARY_HD static T Add(T a, T b) {
    return static_cast<T>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
  TRIBUTARY_HD static T Divide(T x, uint64_t d) { return static_cast<T>(DivideTruncating(x, d)); }
};
struct I64Op {
  using T = int64_t;
  TRIBUTARY_HD static T Add(T a, T b) {
    return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
  TRIBUTARY_HD static T Divide(T x, uint64_t d) { return DivideTruncating(x, d); }
};

// ---- Loads and stores.

// kBytes never forms a T* (a misaligned T* would let the compiler emit one wide load, which
// faults on a GPU): the address stays a char*, so memcpy compiles to byte accesses.
template <typename T, LoadMode M>
TRIBUTARY_HD inline T LoadAt(const void* base, size_t i) {
  if constexpr (M == LoadMode::kBytes) {
    T v;
    memcpy(&v, static_cast<const char*>(base) + i * sizeof(T), sizeof(T));
    return v;
  } else {
    return static_cast<const T*>(base)[i];
  }
}
template <typename T, LoadMode M>
TRIBUTARY_HD inline void StoreAt(void* base, size_t i, T v) {
  if constexpr (M == LoadMode::kBytes) {
    memcpy(static_cast<char*>(base) + i * sizeof(T), &v, sizeof(T));
  } else {
    static_cast<T*>(base)[i] = v;
  }
}

// Element i of the pass, read before written.
template <typename Op, LoadMode M>
TRIBUTARY_HD inline void ReduceElement(const ReduceArgs& a, size_t i) {
  using T = typename Op::T;
  T acc = LoadAt<T, M>(a.src[0], i);
  TRIBUTARY_UNROLL
  for (int s = 1; s < kMaxSources; ++s) {
    if (s < a.num_sources) acc = Op::Add(acc, LoadAt<T, M>(a.src[s], i));
  }
  if (a.divide) acc = Op::Divide(acc, a.divisor);
  StoreAt<T, M>(a.dst, i, acc);
}

// 16 bytes of elements. A union is how CUDA code reinterprets a uint4 register group (nvcc and
// gcc define this use of unions).
template <typename T>
union Vector16 {
  uint4 raw;
  T e[16 / sizeof(T)];
};

// 16 aligned bytes. The device reinterprets (what CUDA code does); the host copies, which its
// compiler's aliasing rules require (and turns into the same single load).
TRIBUTARY_HD inline uint4 Load16(const void* p) {
#ifdef __CUDA_ARCH__
  return *static_cast<const uint4*>(p);
#else
  uint4 v;
  memcpy(&v, p, sizeof(v));
  return v;
#endif
}
TRIBUTARY_HD inline void Store16(void* p, uint4 v) {
#ifdef __CUDA_ARCH__
  *static_cast<uint4*>(p) = v;
#else
  memcpy(p, &v, sizeof(v));
#endif
}

// Sources up to which a thread reduces two vectors at once (TakesPairs).
inline constexpr int kPairSources = 4;

// `kVectors` 16-byte vectors of one thread at once (vector indices `v`, after the `head` scalar
// elements), folding at most `kSources` sources: every load of all of them is issued before the
// first addition. One vector per step (kVectors 1, any number of sources) or two (kVectors 2,
// at most kPairSources): two keep twice the bytes in flight per thread, which the memory system
// needs at few sources (on an H100, one vector at a time reached 0.87-0.93 of the
// device-to-device copy at k = 1 and 2, two 0.94-0.97); beyond kPairSources one vector already
// has enough loads in flight. Pairs run in kernels of their own (ReduceThread's `Pair`): in the
// same kernel as the 8-source path their registers cost that path occupancy (k = 8 fp16 average
// fell from 1.00 to 0.86 of the copy).
template <typename Op, int kVectors, int kSources>
TRIBUTARY_HD inline void ReduceVectors(const ReduceArgs& a, size_t head,
                                       const size_t (&v)[kVectors]) {
  using T = typename Op::T;
  constexpr size_t kLanes = 16 / sizeof(T);
  size_t first[kVectors];
  Vector16<T> acc[kVectors];
  TRIBUTARY_UNROLL
  for (int j = 0; j < kVectors; ++j) {
    first[j] = head + v[j] * kLanes;
    acc[j].raw = Load16(static_cast<const T*>(a.src[0]) + first[j]);
  }
  TRIBUTARY_UNROLL
  for (int s = 1; s < kSources; ++s) {
    if (s < a.num_sources) {
      Vector16<T> x[kVectors];
      TRIBUTARY_UNROLL
      for (int j = 0; j < kVectors; ++j)
        x[j].raw = Load16(static_cast<const T*>(a.src[s]) + first[j]);
      TRIBUTARY_UNROLL
      for (int j = 0; j < kVectors; ++j) {
        TRIBUTARY_UNROLL
        for (size_t l = 0; l < kLanes; ++l) acc[j].e[l] = Op::Add(acc[j].e[l], x[j].e[l]);
      }
    }
  }
  TRIBUTARY_UNROLL
  for (int j = 0; j < kVectors; ++j) {
    if (a.divide) {
      TRIBUTARY_UNROLL
      for (size_t l = 0; l < kLanes; ++l) acc[j].e[l] = Op::Divide(acc[j].e[l], a.divisor);
    }
    Store16(static_cast<T*>(a.dst) + first[j], acc[j].raw);
  }
}

// Whether a kVector16 pass runs the two-vector kernel.
inline bool TakesPairs(const ReduceArgs& a) { return a.num_sources <= kPairSources; }

// The work of thread `tid` of `threads` (grid-stride): in kVector16 mode, the elements before
// the first 16-byte boundary, the whole vectors (with `Pair`, which TakesPairs passes: two per
// step, v and v + threads, so a warp's loads stay contiguous), then the tail; otherwise every
// element. Threads write disjoint elements, so running them in any order gives the same result.
template <typename Op, LoadMode M, bool Pair = false>
TRIBUTARY_HD inline void ReduceThread(const ReduceArgs& a, size_t tid, size_t threads) {
  using T = typename Op::T;
  if constexpr (M == LoadMode::kVector16) {
    constexpr size_t kLanes = 16 / sizeof(T);
    const size_t misalign = reinterpret_cast<uintptr_t>(a.dst) % 16;
    size_t head = misalign == 0 ? 0 : (16 - misalign) / sizeof(T);
    if (head > a.count) head = a.count;
    const size_t vectors = (a.count - head) / kLanes;
    const size_t tail_begin = head + vectors * kLanes;
    for (size_t i = tid; i < head; i += threads) ReduceElement<Op, LoadMode::kElement>(a, i);
    size_t v = tid;
    if constexpr (Pair) {
      for (; v + threads < vectors; v += 2 * threads) {
        ReduceVectors<Op, 2, kPairSources>(a, head, {v, v + threads});
      }
    }
    for (; v < vectors; v += threads) ReduceVectors<Op, 1, kMaxSources>(a, head, {v});
    for (size_t i = tail_begin + tid; i < a.count; i += threads) {
      ReduceElement<Op, LoadMode::kElement>(a, i);
    }
  } else {
    for (size_t i = tid; i < a.count; i += threads) ReduceElement<Op, M>(a, i);
  }
}

// The work items a pass has in `mode` (vectors plus at most 15 scalar elements), to size grids.
inline size_t WorkItems(const ReduceArgs& a, size_t element_size, LoadMode mode) {
  return mode == LoadMode::kVector16 ? a.count / (16 / element_size) + 16 : a.count;
}

inline size_t ElementSize(ElementType t) {
  switch (t) {
    case ElementType::kF32:
    case ElementType::kI32:
      return 4;
    case ElementType::kF64:
    case ElementType::kI64:
      return 8;
    case ElementType::kF16:
    case ElementType::kBf16:
      return 2;
  }
  return 0;
}

// Calls f.template operator()<Op>() for `t`'s Op struct.
template <typename F>
inline void DispatchElementType(ElementType t, F&& f) {
  switch (t) {
    case ElementType::kF32:
      return f.template operator()<F32Op>();
    case ElementType::kF64:
      return f.template operator()<F64Op>();
    case ElementType::kF16:
      return f.template operator()<F16Op>();
    case ElementType::kBf16:
      return f.template operator()<Bf16Op>();
    case ElementType::kI32:
      return f.template operator()<I32Op>();
    case ElementType::kI64:
      return f.template operator()<I64Op>();
  }
}

// The kernel's work on the host: every thread of a `threads`-thread grid, in order. Host
// pointers; for tests of the index math and arithmetic without a GPU.
inline void ReduceOnHost(ElementType t, const ReduceArgs& a, size_t threads) {
  const LoadMode mode = SelectLoadMode(a, ElementSize(t));
  DispatchElementType(t, [&]<typename Op>() {
    for (size_t tid = 0; tid < threads; ++tid) {
      switch (mode) {
        case LoadMode::kVector16:
          if (TakesPairs(a)) {
            ReduceThread<Op, LoadMode::kVector16, true>(a, tid, threads);
          } else {
            ReduceThread<Op, LoadMode::kVector16>(a, tid, threads);
          }
          break;
        case LoadMode::kElement:
          ReduceThread<Op, LoadMode::kElement>(a, tid, threads);
          break;
        case LoadMode::kBytes:
          ReduceThread<Op, LoadMode::kBytes>(a, tid, threads);
          break;
      }
    }
  });
}

// Launches one pass on `stream` with at most `max_blocks` blocks of 256 threads (the grid is
// sized to the work, grid-stride beyond). Returns the launch's error; asynchronous failures show
// on the stream. Defined in reduce_kernels.cu.
cudaError_t LaunchReduce(ElementType t, const ReduceArgs& args, int max_blocks,
                         cudaStream_t stream);

}  // namespace tributary::dataplane::cuda_reduce
