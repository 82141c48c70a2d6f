// AVX2 + F16C kernels. Every function that uses the instructions carries TRIBUTARY_AVX2, so this
// file builds with the project's baseline flags and only runs after a CPU check (cpu_reducer.cc).
#include "dataplane/reduce/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "dataplane/reduce/cpu/scalar_ops.h"

#define TRIBUTARY_AVX2 __attribute__((target("avx2,f16c")))

namespace tributary::dataplane::reduce_internal {
namespace {

constexpr int kF16Round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

TRIBUTARY_AVX2 inline __m256 Canonicalize(__m256 x) {
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kCanonicalNanF32)));
  return _mm256_blendv_ps(x, nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

TRIBUTARY_AVX2 inline __m256d Canonicalize(__m256d x) {
  const __m256d nan =
      _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(kCanonicalNanF64)));
  return _mm256_blendv_pd(x, nan, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}

// Lane traits. Load/Store move kLanes elements between memory (any alignment) and the
// computation type V (float32 lanes for the 16-bit floating types).
struct F32x8 {
  using Op = F32Op;
  using V = __m256;
  using DivArg = __m256;
  static constexpr size_t kLanes = 8;
  TRIBUTARY_AVX2 static V Load(const char* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  TRIBUTARY_AVX2 static void Store(char* p, V v) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
  }
  TRIBUTARY_AVX2 static V Add(V a, V b) { return Canonicalize(_mm256_add_ps(a, b)); }
  TRIBUTARY_AVX2 static DivArg MakeDivArg(uint64_t d) {
    return _mm256_set1_ps(static_cast<float>(d));
  }
  TRIBUTARY_AVX2 static V Divide(V x, DivArg d) { return Canonicalize(_mm256_div_ps(x, d)); }
};

struct F64x4 {
  using Op = F64Op;
  using V = __m256d;
  using DivArg = __m256d;
  static constexpr size_t kLanes = 4;
  TRIBUTARY_AVX2 static V Load(const char* p) {
    return _mm256_loadu_pd(reinterpret_cast<const double*>(p));
  }
  TRIBUTARY_AVX2 static void Store(char* p, V v) {
    _mm256_storeu_pd(reinterpret_cast<double*>(p), v);
  }
  TRIBUTARY_AVX2 static V Add(V a, V b) { return Canonicalize(_mm256_add_pd(a, b)); }
  TRIBUTARY_AVX2 static DivArg MakeDivArg(uint64_t d) {
    return _mm256_set1_pd(static_cast<double>(d));
  }
  TRIBUTARY_AVX2 static V Divide(V x, DivArg d) { return Canonicalize(_mm256_div_pd(x, d)); }
};

struct F16x8 {
  using Op = F16Op;
  using V = __m256;
  using DivArg = __m256;
  static constexpr size_t kLanes = 8;
  TRIBUTARY_AVX2 static V Load(const char* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // Input is already NaN-canonical; vcvtps2ph rounds to nearest even, overflow -> Inf.
  TRIBUTARY_AVX2 static void Store(char* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kF16Round));
  }
  TRIBUTARY_AVX2 static V Add(V a, V b) { return Canonicalize(_mm256_add_ps(a, b)); }
  TRIBUTARY_AVX2 static DivArg MakeDivArg(uint64_t d) {
    return _mm256_set1_ps(static_cast<float>(d));
  }
  TRIBUTARY_AVX2 static V Divide(V x, DivArg d) { return Canonicalize(_mm256_div_ps(x, d)); }
};

// 16 bfloat16 per vector, computed as two float32 halves. The halves come from interleaving
// zero words below the data (unpack), which puts each bfloat16 in the top of a 32-bit lane
// without a shift; packus undoes the in-lane interleave exactly, so no cross-lane permute.
struct Bf16x16 {
  using Op = Bf16Op;
  struct V {
    __m256 lo;  // Elements 0-3 and 8-11.
    __m256 hi;  // Elements 4-7 and 12-15.
  };
  using DivArg = __m256;
  static constexpr size_t kLanes = 16;
  TRIBUTARY_AVX2 static V Load(const char* p) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x))};
  }
  // Round to nearest even in integer arithmetic (vcvtneps2bf16 would flush subnormals); the
  // result is in the low 16 bits of each lane. The canonical NaN 0x7FC00000 maps to 0x7FC0.
  TRIBUTARY_AVX2 static __m256i Round(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))),
                             16);
  }
  // Input is already NaN-canonical.
  TRIBUTARY_AVX2 static void Store(char* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_packus_epi32(Round(v.lo), Round(v.hi)));
  }
  TRIBUTARY_AVX2 static V Add(V a, V b) {
    return {Canonicalize(_mm256_add_ps(a.lo, b.lo)), Canonicalize(_mm256_add_ps(a.hi, b.hi))};
  }
  TRIBUTARY_AVX2 static DivArg MakeDivArg(uint64_t d) {
    return _mm256_set1_ps(static_cast<float>(d));
  }
  TRIBUTARY_AVX2 static V Divide(V x, DivArg d) {
    return {Canonicalize(_mm256_div_ps(x.lo, d)), Canonicalize(_mm256_div_ps(x.hi, d))};
  }
};

struct I32x8 {
  using Op = I32Op;
  using V = __m256i;
  using DivArg = __m256d;
  static constexpr size_t kLanes = 8;
  TRIBUTARY_AVX2 static V Load(const char* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  TRIBUTARY_AVX2 static void Store(char* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  TRIBUTARY_AVX2 static V Add(V a, V b) { return _mm256_add_epi32(a, b); }
  TRIBUTARY_AVX2 static DivArg MakeDivArg(uint64_t d) {
    return _mm256_set1_pd(static_cast<double>(d));
  }
  // Exact: an int32 quotient in float64 is off by less than 1/d from the true one, which is
  // never enough to cross an integer, so truncation matches integer division.
  TRIBUTARY_AVX2 static V Divide(V x, DivArg d) {
    const __m128i lo =
        _mm256_cvttpd_epi32(_mm256_div_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(x)), d));
    const __m128i hi =
        _mm256_cvttpd_epi32(_mm256_div_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(x, 1)), d));
    return _mm256_set_m128i(hi, lo);
  }
};

struct I64x4 {
  using Op = I64Op;
  using V = __m256i;
  static constexpr size_t kLanes = 4;
  TRIBUTARY_AVX2 static V Load(const char* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  TRIBUTARY_AVX2 static void Store(char* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  TRIBUTARY_AVX2 static V Add(V a, V b) { return _mm256_add_epi64(a, b); }
};

// Elements to process one by one before `p` reaches a vector boundary (0 when `p` is not even
// element-aligned: then no boundary is reachable).
template <size_t kElem, size_t kVecBytes>
inline size_t HeadElements(const void* p, size_t n) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  if (addr % kElem != 0) return 0;
  const size_t head = ((kVecBytes - addr % kVecBytes) % kVecBytes) / kElem;
  return head < n ? head : n;
}

template <typename K>
TRIBUTARY_AVX2 void Sum2(void* dst, const void* a, const void* b, size_t n) {
  using T = typename K::Op::T;
  constexpr size_t kVecBytes = sizeof(T) * K::kLanes;
  char* d = static_cast<char*>(dst);
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  // Peel so that the stores are aligned; loads stay unaligned.
  size_t i = HeadElements<sizeof(T), kVecBytes>(dst, n);
  ScalarSum2<typename K::Op>(dst, a, b, 0, i);
  for (; i + 4 * K::kLanes <= n; i += 4 * K::kLanes) {
    const size_t o = i * sizeof(T);
    for (size_t j = 0; j < 4; ++j) {
      const size_t oj = o + j * kVecBytes;
      K::Store(d + oj, K::Add(K::Load(pa + oj), K::Load(pb + oj)));
    }
  }
  for (; i + K::kLanes <= n; i += K::kLanes) {
    const size_t o = i * sizeof(T);
    K::Store(d + o, K::Add(K::Load(pa + o), K::Load(pb + o)));
  }
  ScalarSum2<typename K::Op>(dst, a, b, i, n);
}

template <typename K>
TRIBUTARY_AVX2 void Divide(void* dst, size_t n, uint64_t divisor) {
  using T = typename K::Op::T;
  constexpr size_t kVecBytes = sizeof(T) * K::kLanes;
  char* d = static_cast<char*>(dst);
  size_t i = HeadElements<sizeof(T), kVecBytes>(dst, n);
  ScalarDivide<typename K::Op>(dst, divisor, 0, i);
  const typename K::DivArg arg = K::MakeDivArg(divisor);
  for (; i + K::kLanes <= n; i += K::kLanes) {
    const size_t o = i * sizeof(T);
    K::Store(d + o, K::Divide(K::Load(d + o), arg));
  }
  ScalarDivide<typename K::Op>(dst, divisor, i, n);
}

// No vector integer division for 64-bit lanes; the scalar loop is exact.
void DivideI64(void* dst, size_t n, uint64_t divisor) { ScalarDivide<I64Op>(dst, divisor, 0, n); }

using common::DataType;

KernelTable MakeTable() {
  KernelTable t{};
  t.isa = "avx2";
  t.sum2[Slot(DataType::kFloat32)] = &Sum2<F32x8>;
  t.sum2[Slot(DataType::kFloat64)] = &Sum2<F64x4>;
  t.sum2[Slot(DataType::kFloat16)] = &Sum2<F16x8>;
  t.sum2[Slot(DataType::kBFloat16)] = &Sum2<Bf16x16>;
  t.sum2[Slot(DataType::kInt32)] = &Sum2<I32x8>;
  t.sum2[Slot(DataType::kInt64)] = &Sum2<I64x4>;
  t.divide[Slot(DataType::kFloat32)] = &Divide<F32x8>;
  t.divide[Slot(DataType::kFloat64)] = &Divide<F64x4>;
  t.divide[Slot(DataType::kFloat16)] = &Divide<F16x8>;
  t.divide[Slot(DataType::kBFloat16)] = &Divide<Bf16x16>;
  t.divide[Slot(DataType::kInt32)] = &Divide<I32x8>;
  t.divide[Slot(DataType::kInt64)] = &DivideI64;
  return t;
}

}  // namespace

const KernelTable* Avx2Kernels() {
  static const KernelTable table = MakeTable();
  return &table;
}

}  // namespace tributary::dataplane::reduce_internal

#else  // Not x86.

namespace tributary::dataplane::reduce_internal {
const KernelTable* Avx2Kernels() { return nullptr; }
}  // namespace tributary::dataplane::reduce_internal

#endif
