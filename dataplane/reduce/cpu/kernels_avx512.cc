// AVX-512 (F, BW, VL) kernels. Heads and tails use masked loads and stores, so no element is
// processed by scalar code except in the int64 division. Every function that uses the
// instructions carries TRIBUTARY_AVX512; the CPU check lives in cpu_reducer.cc.
#include "dataplane/reduce/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

// GCC 12 reports its own _mm512_undefined_* placeholders in avx512fintrin.h as maybe
// uninitialized when the conversions below are inlined; the values are never read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "dataplane/reduce/cpu/scalar_ops.h"

#define TRIBUTARY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

namespace tributary::dataplane::reduce_internal {
namespace {

constexpr int kF16Round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

TRIBUTARY_AVX512 inline __m512 Canonicalize(__m512 x) {
  const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(kCanonicalNanF32)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, nan);
}

TRIBUTARY_AVX512 inline __m512d Canonicalize(__m512d x) {
  const __m512d nan =
      _mm512_castsi512_pd(_mm512_set1_epi64(static_cast<long long>(kCanonicalNanF64)));
  return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), x, nan);
}

// Lane traits. Load/Store move kLanes elements between memory (any alignment) and the
// computation type V (float32 lanes for the 16-bit floating types); the masked forms touch only
// the lanes set in `m` and never fault on the others.
struct F32x16 {
  using Op = F32Op;
  using V = __m512;
  using Mask = __mmask16;
  using DivArg = __m512;
  static constexpr size_t kLanes = 16;
  TRIBUTARY_AVX512 static V Load(const char* p) { return _mm512_loadu_ps(p); }
  TRIBUTARY_AVX512 static V LoadMasked(const char* p, Mask m) {
    return _mm512_maskz_loadu_ps(m, p);
  }
  TRIBUTARY_AVX512 static void Store(char* p, V v) { _mm512_storeu_ps(p, v); }
  TRIBUTARY_AVX512 static void StoreMasked(char* p, Mask m, V v) { _mm512_mask_storeu_ps(p, m, v); }
  TRIBUTARY_AVX512 static V Add(V a, V b) { return Canonicalize(_mm512_add_ps(a, b)); }
  TRIBUTARY_AVX512 static DivArg MakeDivArg(uint64_t d) {
    return _mm512_set1_ps(static_cast<float>(d));
  }
  TRIBUTARY_AVX512 static V Divide(V x, DivArg d) { return Canonicalize(_mm512_div_ps(x, d)); }
};

struct F64x8 {
  using Op = F64Op;
  using V = __m512d;
  using Mask = __mmask8;
  using DivArg = __m512d;
  static constexpr size_t kLanes = 8;
  TRIBUTARY_AVX512 static V Load(const char* p) { return _mm512_loadu_pd(p); }
  TRIBUTARY_AVX512 static V LoadMasked(const char* p, Mask m) {
    return _mm512_maskz_loadu_pd(m, p);
  }
  TRIBUTARY_AVX512 static void Store(char* p, V v) { _mm512_storeu_pd(p, v); }
  TRIBUTARY_AVX512 static void StoreMasked(char* p, Mask m, V v) { _mm512_mask_storeu_pd(p, m, v); }
  TRIBUTARY_AVX512 static V Add(V a, V b) { return Canonicalize(_mm512_add_pd(a, b)); }
  TRIBUTARY_AVX512 static DivArg MakeDivArg(uint64_t d) {
    return _mm512_set1_pd(static_cast<double>(d));
  }
  TRIBUTARY_AVX512 static V Divide(V x, DivArg d) { return Canonicalize(_mm512_div_pd(x, d)); }
};

struct F16x16 {
  using Op = F16Op;
  using V = __m512;
  using Mask = __mmask16;
  using DivArg = __m512;
  static constexpr size_t kLanes = 16;
  TRIBUTARY_AVX512 static V Load(const char* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  TRIBUTARY_AVX512 static V LoadMasked(const char* p, Mask m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
  TRIBUTARY_AVX512 static void Store(char* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, kF16Round));
  }
  TRIBUTARY_AVX512 static void StoreMasked(char* p, Mask m, V v) {
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, kF16Round));
  }
  TRIBUTARY_AVX512 static V Add(V a, V b) { return Canonicalize(_mm512_add_ps(a, b)); }
  TRIBUTARY_AVX512 static DivArg MakeDivArg(uint64_t d) {
    return _mm512_set1_ps(static_cast<float>(d));
  }
  TRIBUTARY_AVX512 static V Divide(V x, DivArg d) { return Canonicalize(_mm512_div_ps(x, d)); }
};

// 32 bfloat16 per vector, computed as two float32 halves. The halves come from interleaving
// zero words below the data (unpack), which puts each bfloat16 in the top of a 32-bit lane
// without a shift; packus undoes the in-lane interleave exactly, so no cross-lane permute.
struct Bf16x32 {
  using Op = Bf16Op;
  struct V {
    __m512 lo;  // Elements 0-3, 8-11, 16-19, 24-27.
    __m512 hi;  // Elements 4-7, 12-15, 20-23, 28-31.
  };
  using Mask = __mmask32;
  using DivArg = __m512;
  static constexpr size_t kLanes = 32;
  TRIBUTARY_AVX512 static V Widen(__m512i x) {
    const __m512i zero = _mm512_setzero_si512();
    return {_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, x)),
            _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, x))};
  }
  // Round to nearest even in integer arithmetic (vcvtneps2bf16 would flush subnormals), then
  // pack the top halves back in order. Input is NaN-canonical: 0x7FC00000 maps to 0x7FC0.
  TRIBUTARY_AVX512 static __m512i Round(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))),
                             16);
  }
  TRIBUTARY_AVX512 static __m512i Narrow(V v) {
    return _mm512_packus_epi32(Round(v.lo), Round(v.hi));
  }
  TRIBUTARY_AVX512 static V Load(const char* p) { return Widen(_mm512_loadu_si512(p)); }
  TRIBUTARY_AVX512 static V LoadMasked(const char* p, Mask m) {
    return Widen(_mm512_maskz_loadu_epi16(m, p));
  }
  TRIBUTARY_AVX512 static void Store(char* p, V v) { _mm512_storeu_si512(p, Narrow(v)); }
  TRIBUTARY_AVX512 static void StoreMasked(char* p, Mask m, V v) {
    _mm512_mask_storeu_epi16(p, m, Narrow(v));
  }
  TRIBUTARY_AVX512 static V Add(V a, V b) {
    return {Canonicalize(_mm512_add_ps(a.lo, b.lo)), Canonicalize(_mm512_add_ps(a.hi, b.hi))};
  }
  TRIBUTARY_AVX512 static DivArg MakeDivArg(uint64_t d) {
    return _mm512_set1_ps(static_cast<float>(d));
  }
  TRIBUTARY_AVX512 static V Divide(V x, DivArg d) {
    return {Canonicalize(_mm512_div_ps(x.lo, d)), Canonicalize(_mm512_div_ps(x.hi, d))};
  }
};

struct I32x16 {
  using Op = I32Op;
  using V = __m512i;
  using Mask = __mmask16;
  using DivArg = __m512d;
  static constexpr size_t kLanes = 16;
  TRIBUTARY_AVX512 static V Load(const char* p) { return _mm512_loadu_si512(p); }
  TRIBUTARY_AVX512 static V LoadMasked(const char* p, Mask m) {
    return _mm512_maskz_loadu_epi32(m, p);
  }
  TRIBUTARY_AVX512 static void Store(char* p, V v) { _mm512_storeu_si512(p, v); }
  TRIBUTARY_AVX512 static void StoreMasked(char* p, Mask m, V v) {
    _mm512_mask_storeu_epi32(p, m, v);
  }
  TRIBUTARY_AVX512 static V Add(V a, V b) { return _mm512_add_epi32(a, b); }
  TRIBUTARY_AVX512 static DivArg MakeDivArg(uint64_t d) {
    return _mm512_set1_pd(static_cast<double>(d));
  }
  // Exact: an int32 quotient in float64 is off by less than 1/d from the true one, which is
  // never enough to cross an integer, so truncation matches integer division.
  TRIBUTARY_AVX512 static V Divide(V x, DivArg d) {
    const __m256i lo =
        _mm512_cvttpd_epi32(_mm512_div_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(x)), d));
    const __m256i hi =
        _mm512_cvttpd_epi32(_mm512_div_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(x, 1)), d));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
};

struct I64x8 {
  using Op = I64Op;
  using V = __m512i;
  using Mask = __mmask8;
  static constexpr size_t kLanes = 8;
  TRIBUTARY_AVX512 static V Load(const char* p) { return _mm512_loadu_si512(p); }
  TRIBUTARY_AVX512 static V LoadMasked(const char* p, Mask m) {
    return _mm512_maskz_loadu_epi64(m, p);
  }
  TRIBUTARY_AVX512 static void Store(char* p, V v) { _mm512_storeu_si512(p, v); }
  TRIBUTARY_AVX512 static void StoreMasked(char* p, Mask m, V v) {
    _mm512_mask_storeu_epi64(p, m, v);
  }
  TRIBUTARY_AVX512 static V Add(V a, V b) { return _mm512_add_epi64(a, b); }
};

// Mask of the lanes [0, count), count < K::kLanes <= 32.
template <typename K>
inline typename K::Mask FirstLanes(size_t count) {
  return static_cast<typename K::Mask>((uint32_t{1} << count) - 1);
}

// Elements before `p` reaches a vector boundary (0 when `p` is not element-aligned: then no
// boundary is reachable).
template <size_t kElem, size_t kVecBytes>
inline size_t HeadElements(const void* p, size_t n) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  if (addr % kElem != 0) return 0;
  const size_t head = ((kVecBytes - addr % kVecBytes) % kVecBytes) / kElem;
  return head < n ? head : n;
}

template <typename K>
TRIBUTARY_AVX512 void Sum2(void* dst, const void* a, const void* b, size_t n) {
  using T = typename K::Op::T;
  constexpr size_t kVecBytes = sizeof(T) * K::kLanes;
  char* d = static_cast<char*>(dst);
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  // Peel with a mask so that the full-width stores are aligned; loads stay unaligned.
  size_t i = HeadElements<sizeof(T), kVecBytes>(dst, n);
  if (i > 0) {
    const typename K::Mask m = FirstLanes<K>(i);
    K::StoreMasked(d, m, K::Add(K::LoadMasked(pa, m), K::LoadMasked(pb, m)));
  }
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
  if (i < n) {
    const size_t o = i * sizeof(T);
    const typename K::Mask m = FirstLanes<K>(n - i);
    K::StoreMasked(d + o, m, K::Add(K::LoadMasked(pa + o, m), K::LoadMasked(pb + o, m)));
  }
}

template <typename K>
TRIBUTARY_AVX512 void Divide(void* dst, size_t n, uint64_t divisor) {
  using T = typename K::Op::T;
  constexpr size_t kVecBytes = sizeof(T) * K::kLanes;
  char* d = static_cast<char*>(dst);
  const typename K::DivArg arg = K::MakeDivArg(divisor);
  size_t i = HeadElements<sizeof(T), kVecBytes>(dst, n);
  if (i > 0) {
    const typename K::Mask m = FirstLanes<K>(i);
    K::StoreMasked(d, m, K::Divide(K::LoadMasked(d, m), arg));
  }
  for (; i + K::kLanes <= n; i += K::kLanes) {
    const size_t o = i * sizeof(T);
    K::Store(d + o, K::Divide(K::Load(d + o), arg));
  }
  if (i < n) {
    const size_t o = i * sizeof(T);
    const typename K::Mask m = FirstLanes<K>(n - i);
    K::StoreMasked(d + o, m, K::Divide(K::LoadMasked(d + o, m), arg));
  }
}

// No vector integer division for 64-bit lanes (and float64 cannot hold every int64 exactly);
// the scalar loop is exact.
void DivideI64(void* dst, size_t n, uint64_t divisor) { ScalarDivide<I64Op>(dst, divisor, 0, n); }

using common::DataType;

KernelTable MakeTable() {
  KernelTable t{};
  t.isa = "avx512";
  t.sum2[Slot(DataType::kFloat32)] = &Sum2<F32x16>;
  t.sum2[Slot(DataType::kFloat64)] = &Sum2<F64x8>;
  t.sum2[Slot(DataType::kFloat16)] = &Sum2<F16x16>;
  t.sum2[Slot(DataType::kBFloat16)] = &Sum2<Bf16x32>;
  t.sum2[Slot(DataType::kInt32)] = &Sum2<I32x16>;
  t.sum2[Slot(DataType::kInt64)] = &Sum2<I64x8>;
  t.divide[Slot(DataType::kFloat32)] = &Divide<F32x16>;
  t.divide[Slot(DataType::kFloat64)] = &Divide<F64x8>;
  t.divide[Slot(DataType::kFloat16)] = &Divide<F16x16>;
  t.divide[Slot(DataType::kBFloat16)] = &Divide<Bf16x32>;
  t.divide[Slot(DataType::kInt32)] = &Divide<I32x16>;
  t.divide[Slot(DataType::kInt64)] = &DivideI64;
  return t;
}

}  // namespace

const KernelTable* Avx512Kernels() {
  static const KernelTable table = MakeTable();
  return &table;
}

}  // namespace tributary::dataplane::reduce_internal

#else  // Not x86.

namespace tributary::dataplane::reduce_internal {
const KernelTable* Avx512Kernels() { return nullptr; }
}  // namespace tributary::dataplane::reduce_internal

#endif
