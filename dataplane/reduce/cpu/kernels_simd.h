// The SIMD kernels, written once over an instruction set's vector traits `V`. Each ISA's
// translation unit (kernels_avx2.cc, kernels_avx512.cc) defines, before including this file:
//   TRIBUTARY_SIMD_TARGET    the function attribute that enables its instructions, so that the
//                            library builds with the baseline flags and the code runs only after
//                            the CPU check in cpu_reducer.cc;
//   TRIBUTARY_SIMD_NAMESPACE the namespace (avx2, avx512) that keeps each ISA's instantiations
//                            and helpers apart from the other's (one definition per name);
// and then its traits V with these static members (all carrying TRIBUTARY_SIMD_TARGET):
//   kIsa, kBytes (vector width), kMasked (true: heads and tails use masked loads and stores;
//   false: they run the scalar reference);
//   types Ps, Pd, Si (float32, float64 and integer vectors) and HalfSi (an integer vector of half
//   the width);
//   LoadPs/StorePs, LoadPd/StorePd, LoadSi/StoreSi, LoadHalfSi/StoreHalfSi (any alignment);
//   Add, Div, Canonicalize (NaN lanes -> the canonical NaN), each overloaded for Ps and Pd, and
//   Set1(float) -> Ps, Set1(double) -> Pd; AddEpi32, AddEpi64, AndSi, Set1Epi32, ZeroSi,
//   SrliEpi32<kShift>, CastPsSi, CastSiPs, UnpackLoEpi16, UnpackHiEpi16, PackusEpi32 (in-lane, as
//   the intrinsics); CvtPhPs / CvtPsPh (binary16 <-> float32, round to nearest even); LowHalf,
//   HighHalf, Join (Si <-> two HalfSi), CvtEpi32Pd, CvttPdEpi32; with kMasked, MaskLoad/MaskStore
//   for Ps, Pd, Si16 (16-bit lanes), HalfSi16, Si32 and Si64, taking the lane mask as uint32_t (bit
//   i: lane i; lanes outside the mask are not touched and never fault).
// Every kernel matches the scalar reference (scalar_ops.h) bit for bit.
#pragma once

#if !defined(TRIBUTARY_SIMD_TARGET) || !defined(TRIBUTARY_SIMD_NAMESPACE)
#error "define TRIBUTARY_SIMD_TARGET and TRIBUTARY_SIMD_NAMESPACE before including kernels_simd.h"
#endif

#include <cstddef>
#include <cstdint>

#include "dataplane/reduce/cpu/kernels.h"
#include "dataplane/reduce/cpu/scalar_ops.h"

namespace tributary::dataplane::reduce_internal::TRIBUTARY_SIMD_NAMESPACE {

// Add and divide in the vector's own floating precision, with NaN lanes made canonical: the
// arithmetic of the float32, float64 and float16 lanes (float16 computes in float32).
template <typename V, typename VecT, typename Scalar>
struct FloatArithmetic {
  using Vec = VecT;
  using DivArg = VecT;
  TRIBUTARY_SIMD_TARGET static Vec Add(Vec a, Vec b) { return V::Canonicalize(V::Add(a, b)); }
  TRIBUTARY_SIMD_TARGET static DivArg MakeDivArg(uint64_t d) {
    return V::Set1(static_cast<Scalar>(d));
  }
  TRIBUTARY_SIMD_TARGET static Vec Divide(Vec x, DivArg d) { return V::Canonicalize(V::Div(x, d)); }
};

// Lane kernels: Load/Store move kLanes elements between memory (any alignment) and the
// computation type Vec (float32 lanes for the 16-bit floating types); the masked forms touch
// only the lanes set in `m`.
template <typename V>
struct F32Lanes : FloatArithmetic<V, typename V::Ps, float> {
  using Op = F32Op;
  using Vec = typename V::Ps;
  static constexpr size_t kLanes = V::kBytes / sizeof(float);
  TRIBUTARY_SIMD_TARGET static Vec Load(const char* p) { return V::LoadPs(p); }
  TRIBUTARY_SIMD_TARGET static Vec LoadMasked(const char* p, uint32_t m) {
    return V::MaskLoadPs(p, m);
  }
  TRIBUTARY_SIMD_TARGET static void Store(char* p, Vec v) { V::StorePs(p, v); }
  TRIBUTARY_SIMD_TARGET static void StoreMasked(char* p, uint32_t m, Vec v) {
    V::MaskStorePs(p, m, v);
  }
};

template <typename V>
struct F64Lanes : FloatArithmetic<V, typename V::Pd, double> {
  using Op = F64Op;
  using Vec = typename V::Pd;
  static constexpr size_t kLanes = V::kBytes / sizeof(double);
  TRIBUTARY_SIMD_TARGET static Vec Load(const char* p) { return V::LoadPd(p); }
  TRIBUTARY_SIMD_TARGET static Vec LoadMasked(const char* p, uint32_t m) {
    return V::MaskLoadPd(p, m);
  }
  TRIBUTARY_SIMD_TARGET static void Store(char* p, Vec v) { V::StorePd(p, v); }
  TRIBUTARY_SIMD_TARGET static void StoreMasked(char* p, uint32_t m, Vec v) {
    V::MaskStorePd(p, m, v);
  }
};

// binary16 in memory, float32 in registers: half a vector of 16-bit lanes per float32 vector.
// Inputs to Store are already NaN-canonical; the conversion rounds to nearest even and
// overflows to Inf, as the reference does.
template <typename V>
struct F16Lanes : FloatArithmetic<V, typename V::Ps, float> {
  using Op = F16Op;
  using Vec = typename V::Ps;
  static constexpr size_t kLanes = V::kBytes / sizeof(float);
  TRIBUTARY_SIMD_TARGET static Vec Load(const char* p) { return V::CvtPhPs(V::LoadHalfSi(p)); }
  TRIBUTARY_SIMD_TARGET static Vec LoadMasked(const char* p, uint32_t m) {
    return V::CvtPhPs(V::MaskLoadHalfSi16(p, m));
  }
  TRIBUTARY_SIMD_TARGET static void Store(char* p, Vec v) { V::StoreHalfSi(p, V::CvtPsPh(v)); }
  TRIBUTARY_SIMD_TARGET static void StoreMasked(char* p, uint32_t m, Vec v) {
    V::MaskStoreHalfSi16(p, m, V::CvtPsPh(v));
  }
};

// A full vector of bfloat16, computed as two float32 halves. The halves come from interleaving
// zero words below the data (unpack), which puts each bfloat16 in the top of a 32-bit lane
// without a shift; packus undoes the in-lane interleave exactly, so no cross-lane permute.
template <typename V>
struct Bf16Lanes {
  using Op = Bf16Op;
  using Half = FloatArithmetic<V, typename V::Ps, float>;
  struct Vec {
    typename V::Ps lo;  // Elements 0-3 of every 128-bit lane.
    typename V::Ps hi;  // Elements 4-7 of every 128-bit lane.
  };
  using DivArg = typename V::Ps;
  static constexpr size_t kLanes = V::kBytes / sizeof(uint16_t);
  TRIBUTARY_SIMD_TARGET static Vec Widen(typename V::Si x) {
    const typename V::Si zero = V::ZeroSi();
    return {V::CastSiPs(V::UnpackLoEpi16(zero, x)), V::CastSiPs(V::UnpackHiEpi16(zero, x))};
  }
  // Round to nearest even in integer arithmetic (vcvtneps2bf16 would flush subnormals); the
  // result is in the low 16 bits of each lane. Input is NaN-canonical: 0x7FC00000 maps to 0x7FC0.
  TRIBUTARY_SIMD_TARGET static typename V::Si Round(typename V::Ps v) {
    const typename V::Si u = V::CastPsSi(v);
    const typename V::Si lsb = V::AndSi(V::template SrliEpi32<16>(u), V::Set1Epi32(1));
    return V::template SrliEpi32<16>(V::AddEpi32(u, V::AddEpi32(lsb, V::Set1Epi32(0x7FFF))));
  }
  TRIBUTARY_SIMD_TARGET static typename V::Si Narrow(Vec v) {
    return V::PackusEpi32(Round(v.lo), Round(v.hi));
  }
  TRIBUTARY_SIMD_TARGET static Vec Load(const char* p) { return Widen(V::LoadSi(p)); }
  TRIBUTARY_SIMD_TARGET static Vec LoadMasked(const char* p, uint32_t m) {
    return Widen(V::MaskLoadSi16(p, m));
  }
  TRIBUTARY_SIMD_TARGET static void Store(char* p, Vec v) { V::StoreSi(p, Narrow(v)); }
  TRIBUTARY_SIMD_TARGET static void StoreMasked(char* p, uint32_t m, Vec v) {
    V::MaskStoreSi16(p, m, Narrow(v));
  }
  TRIBUTARY_SIMD_TARGET static Vec Add(Vec a, Vec b) {
    return {Half::Add(a.lo, b.lo), Half::Add(a.hi, b.hi)};
  }
  TRIBUTARY_SIMD_TARGET static DivArg MakeDivArg(uint64_t d) { return Half::MakeDivArg(d); }
  TRIBUTARY_SIMD_TARGET static Vec Divide(Vec x, DivArg d) {
    return {Half::Divide(x.lo, d), Half::Divide(x.hi, d)};
  }
};

template <typename V>
struct I32Lanes {
  using Op = I32Op;
  using Vec = typename V::Si;
  using DivArg = typename V::Pd;
  static constexpr size_t kLanes = V::kBytes / sizeof(int32_t);
  TRIBUTARY_SIMD_TARGET static Vec Load(const char* p) { return V::LoadSi(p); }
  TRIBUTARY_SIMD_TARGET static Vec LoadMasked(const char* p, uint32_t m) {
    return V::MaskLoadSi32(p, m);
  }
  TRIBUTARY_SIMD_TARGET static void Store(char* p, Vec v) { V::StoreSi(p, v); }
  TRIBUTARY_SIMD_TARGET static void StoreMasked(char* p, uint32_t m, Vec v) {
    V::MaskStoreSi32(p, m, v);
  }
  TRIBUTARY_SIMD_TARGET static Vec Add(Vec a, Vec b) { return V::AddEpi32(a, b); }
  TRIBUTARY_SIMD_TARGET static DivArg MakeDivArg(uint64_t d) {
    return V::Set1(static_cast<double>(d));
  }
  // Exact: an int32 quotient in float64 is off by less than 1/d from the true one, which is
  // never enough to cross an integer, so truncation matches integer division.
  TRIBUTARY_SIMD_TARGET static Vec Divide(Vec x, DivArg d) {
    const typename V::HalfSi lo = V::CvttPdEpi32(V::Div(V::CvtEpi32Pd(V::LowHalf(x)), d));
    const typename V::HalfSi hi = V::CvttPdEpi32(V::Div(V::CvtEpi32Pd(V::HighHalf(x)), d));
    return V::Join(lo, hi);
  }
};

// No Divide: there is no vector integer division for 64-bit lanes (and float64 cannot hold
// every int64 exactly); DivideI64 below runs the exact scalar loop.
template <typename V>
struct I64Lanes {
  using Op = I64Op;
  using Vec = typename V::Si;
  static constexpr size_t kLanes = V::kBytes / sizeof(int64_t);
  TRIBUTARY_SIMD_TARGET static Vec Load(const char* p) { return V::LoadSi(p); }
  TRIBUTARY_SIMD_TARGET static Vec LoadMasked(const char* p, uint32_t m) {
    return V::MaskLoadSi64(p, m);
  }
  TRIBUTARY_SIMD_TARGET static void Store(char* p, Vec v) { V::StoreSi(p, v); }
  TRIBUTARY_SIMD_TARGET static void StoreMasked(char* p, uint32_t m, Vec v) {
    V::MaskStoreSi64(p, m, v);
  }
  TRIBUTARY_SIMD_TARGET static Vec Add(Vec a, Vec b) { return V::AddEpi64(a, b); }
};

// Mask of the lanes [0, count), count < 32.
inline uint32_t FirstLanes(size_t count) { return (uint32_t{1} << count) - 1; }

// Elements before `p` reaches a vector boundary (0 when `p` is not element-aligned: then no
// boundary is reachable).
template <size_t kElem, size_t kVecBytes>
inline size_t HeadElements(const void* p, size_t n) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  if (addr % kElem != 0) return 0;
  const size_t head = ((kVecBytes - addr % kVecBytes) % kVecBytes) / kElem;
  return head < n ? head : n;
}

// dst = a + b. The head is peeled (masked, or by the scalar reference) so that the full-width
// stores are aligned; loads stay unaligned. The main loop is unrolled four times.
template <typename V, typename K>
TRIBUTARY_SIMD_TARGET void Sum2(void* dst, const void* a, const void* b, size_t n) {
  using T = typename K::Op::T;
  constexpr size_t kVecBytes = sizeof(T) * K::kLanes;
  char* d = static_cast<char*>(dst);
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  size_t i = HeadElements<sizeof(T), kVecBytes>(dst, n);
  if constexpr (V::kMasked) {
    if (i > 0) {
      const uint32_t m = FirstLanes(i);
      K::StoreMasked(d, m, K::Add(K::LoadMasked(pa, m), K::LoadMasked(pb, m)));
    }
  } else {
    ScalarSum2<typename K::Op>(dst, a, b, 0, i);
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
  if constexpr (V::kMasked) {
    if (i < n) {
      const size_t o = i * sizeof(T);
      const uint32_t m = FirstLanes(n - i);
      K::StoreMasked(d + o, m, K::Add(K::LoadMasked(pa + o, m), K::LoadMasked(pb + o, m)));
    }
  } else {
    ScalarSum2<typename K::Op>(dst, a, b, i, n);
  }
}

// dst /= divisor, with the head peeled as in Sum2.
template <typename V, typename K>
TRIBUTARY_SIMD_TARGET void Divide(void* dst, size_t n, uint64_t divisor) {
  using T = typename K::Op::T;
  constexpr size_t kVecBytes = sizeof(T) * K::kLanes;
  char* d = static_cast<char*>(dst);
  const typename K::DivArg arg = K::MakeDivArg(divisor);
  size_t i = HeadElements<sizeof(T), kVecBytes>(dst, n);
  if constexpr (V::kMasked) {
    if (i > 0) {
      const uint32_t m = FirstLanes(i);
      K::StoreMasked(d, m, K::Divide(K::LoadMasked(d, m), arg));
    }
  } else {
    ScalarDivide<typename K::Op>(dst, divisor, 0, i);
  }
  for (; i + K::kLanes <= n; i += K::kLanes) {
    const size_t o = i * sizeof(T);
    K::Store(d + o, K::Divide(K::Load(d + o), arg));
  }
  if constexpr (V::kMasked) {
    if (i < n) {
      const size_t o = i * sizeof(T);
      const uint32_t m = FirstLanes(n - i);
      K::StoreMasked(d + o, m, K::Divide(K::LoadMasked(d + o, m), arg));
    }
  } else {
    ScalarDivide<typename K::Op>(dst, divisor, i, n);
  }
}

inline void DivideI64(void* dst, size_t n, uint64_t divisor) {
  ScalarDivide<I64Op>(dst, divisor, 0, n);
}

// The table of one ISA's kernels.
template <typename V>
KernelTable MakeKernelTable() {
  using common::DataType;
  KernelTable t{};
  t.isa = V::kIsa;
  t.sum2[Slot(DataType::kFloat32)] = &Sum2<V, F32Lanes<V>>;
  t.sum2[Slot(DataType::kFloat64)] = &Sum2<V, F64Lanes<V>>;
  t.sum2[Slot(DataType::kFloat16)] = &Sum2<V, F16Lanes<V>>;
  t.sum2[Slot(DataType::kBFloat16)] = &Sum2<V, Bf16Lanes<V>>;
  t.sum2[Slot(DataType::kInt32)] = &Sum2<V, I32Lanes<V>>;
  t.sum2[Slot(DataType::kInt64)] = &Sum2<V, I64Lanes<V>>;
  t.divide[Slot(DataType::kFloat32)] = &Divide<V, F32Lanes<V>>;
  t.divide[Slot(DataType::kFloat64)] = &Divide<V, F64Lanes<V>>;
  t.divide[Slot(DataType::kFloat16)] = &Divide<V, F16Lanes<V>>;
  t.divide[Slot(DataType::kBFloat16)] = &Divide<V, Bf16Lanes<V>>;
  t.divide[Slot(DataType::kInt32)] = &Divide<V, I32Lanes<V>>;
  t.divide[Slot(DataType::kInt64)] = &DivideI64;
  return t;
}

}  // namespace tributary::dataplane::reduce_internal::TRIBUTARY_SIMD_NAMESPACE
