// AVX-512 (F, BW, VL) vector traits for the kernels in kernels_simd.h. Heads and tails use
// masked loads and stores, so no element is processed by scalar code except in the int64
// division. Every function that uses the instructions carries the target attribute; the CPU
// check lives in cpu_reducer.cc.
#include "dataplane/reduce/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

// GCC 12 reports its own _mm512_undefined_* placeholders in avx512fintrin.h as maybe
// uninitialized when the conversions below are inlined; the values are never read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#define TRIBUTARY_SIMD_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#define TRIBUTARY_SIMD_NAMESPACE avx512
#include "dataplane/reduce/cpu/kernels_simd.h"

namespace tributary::dataplane::reduce_internal::avx512 {
namespace {

struct Avx512Traits {
  static constexpr std::string_view kIsa = "avx512";
  static constexpr size_t kBytes = 64;
  static constexpr bool kMasked = true;
  using Ps = __m512;
  using Pd = __m512d;
  using Si = __m512i;
  using HalfSi = __m256i;

  TRIBUTARY_SIMD_TARGET static Ps LoadPs(const char* p) { return _mm512_loadu_ps(p); }
  TRIBUTARY_SIMD_TARGET static void StorePs(char* p, Ps v) { _mm512_storeu_ps(p, v); }
  TRIBUTARY_SIMD_TARGET static Pd LoadPd(const char* p) { return _mm512_loadu_pd(p); }
  TRIBUTARY_SIMD_TARGET static void StorePd(char* p, Pd v) { _mm512_storeu_pd(p, v); }
  TRIBUTARY_SIMD_TARGET static Si LoadSi(const char* p) { return _mm512_loadu_si512(p); }
  TRIBUTARY_SIMD_TARGET static void StoreSi(char* p, Si v) { _mm512_storeu_si512(p, v); }
  TRIBUTARY_SIMD_TARGET static HalfSi LoadHalfSi(const char* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  TRIBUTARY_SIMD_TARGET static void StoreHalfSi(char* p, HalfSi v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }

  // Masked forms: lane i is loaded or stored when bit i of `m` is set; the others read as zero
  // and are neither written nor touched (no fault past the end of a buffer).
  TRIBUTARY_SIMD_TARGET static Ps MaskLoadPs(const char* p, uint32_t m) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>(m), p);
  }
  TRIBUTARY_SIMD_TARGET static void MaskStorePs(char* p, uint32_t m, Ps v) {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>(m), v);
  }
  TRIBUTARY_SIMD_TARGET static Pd MaskLoadPd(const char* p, uint32_t m) {
    return _mm512_maskz_loadu_pd(static_cast<__mmask8>(m), p);
  }
  TRIBUTARY_SIMD_TARGET static void MaskStorePd(char* p, uint32_t m, Pd v) {
    _mm512_mask_storeu_pd(p, static_cast<__mmask8>(m), v);
  }
  TRIBUTARY_SIMD_TARGET static Si MaskLoadSi16(const char* p, uint32_t m) {
    return _mm512_maskz_loadu_epi16(static_cast<__mmask32>(m), p);
  }
  TRIBUTARY_SIMD_TARGET static void MaskStoreSi16(char* p, uint32_t m, Si v) {
    _mm512_mask_storeu_epi16(p, static_cast<__mmask32>(m), v);
  }
  TRIBUTARY_SIMD_TARGET static HalfSi MaskLoadHalfSi16(const char* p, uint32_t m) {
    return _mm256_maskz_loadu_epi16(static_cast<__mmask16>(m), p);
  }
  TRIBUTARY_SIMD_TARGET static void MaskStoreHalfSi16(char* p, uint32_t m, HalfSi v) {
    _mm256_mask_storeu_epi16(p, static_cast<__mmask16>(m), v);
  }
  TRIBUTARY_SIMD_TARGET static Si MaskLoadSi32(const char* p, uint32_t m) {
    return _mm512_maskz_loadu_epi32(static_cast<__mmask16>(m), p);
  }
  TRIBUTARY_SIMD_TARGET static void MaskStoreSi32(char* p, uint32_t m, Si v) {
    _mm512_mask_storeu_epi32(p, static_cast<__mmask16>(m), v);
  }
  TRIBUTARY_SIMD_TARGET static Si MaskLoadSi64(const char* p, uint32_t m) {
    return _mm512_maskz_loadu_epi64(static_cast<__mmask8>(m), p);
  }
  TRIBUTARY_SIMD_TARGET static void MaskStoreSi64(char* p, uint32_t m, Si v) {
    _mm512_mask_storeu_epi64(p, static_cast<__mmask8>(m), v);
  }

  TRIBUTARY_SIMD_TARGET static Ps Add(Ps a, Ps b) { return _mm512_add_ps(a, b); }
  TRIBUTARY_SIMD_TARGET static Pd Add(Pd a, Pd b) { return _mm512_add_pd(a, b); }
  TRIBUTARY_SIMD_TARGET static Ps Div(Ps a, Ps b) { return _mm512_div_ps(a, b); }
  TRIBUTARY_SIMD_TARGET static Pd Div(Pd a, Pd b) { return _mm512_div_pd(a, b); }
  TRIBUTARY_SIMD_TARGET static Ps Set1(float x) { return _mm512_set1_ps(x); }
  TRIBUTARY_SIMD_TARGET static Pd Set1(double x) { return _mm512_set1_pd(x); }
  TRIBUTARY_SIMD_TARGET static Ps Canonicalize(Ps x) {
    const Ps nan = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(kCanonicalNanF32)));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, nan);
  }
  TRIBUTARY_SIMD_TARGET static Pd Canonicalize(Pd x) {
    const Pd nan = _mm512_castsi512_pd(_mm512_set1_epi64(static_cast<long long>(kCanonicalNanF64)));
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), x, nan);
  }

  TRIBUTARY_SIMD_TARGET static Si AddEpi32(Si a, Si b) { return _mm512_add_epi32(a, b); }
  TRIBUTARY_SIMD_TARGET static Si AddEpi64(Si a, Si b) { return _mm512_add_epi64(a, b); }
  TRIBUTARY_SIMD_TARGET static Si AndSi(Si a, Si b) { return _mm512_and_si512(a, b); }
  TRIBUTARY_SIMD_TARGET static Si Set1Epi32(int x) { return _mm512_set1_epi32(x); }
  TRIBUTARY_SIMD_TARGET static Si ZeroSi() { return _mm512_setzero_si512(); }
  template <int kShift>
  TRIBUTARY_SIMD_TARGET static Si SrliEpi32(Si x) {
    return _mm512_srli_epi32(x, kShift);
  }
  TRIBUTARY_SIMD_TARGET static Si CastPsSi(Ps x) { return _mm512_castps_si512(x); }
  TRIBUTARY_SIMD_TARGET static Ps CastSiPs(Si x) { return _mm512_castsi512_ps(x); }
  TRIBUTARY_SIMD_TARGET static Si UnpackLoEpi16(Si a, Si b) { return _mm512_unpacklo_epi16(a, b); }
  TRIBUTARY_SIMD_TARGET static Si UnpackHiEpi16(Si a, Si b) { return _mm512_unpackhi_epi16(a, b); }
  TRIBUTARY_SIMD_TARGET static Si PackusEpi32(Si a, Si b) { return _mm512_packus_epi32(a, b); }

  TRIBUTARY_SIMD_TARGET static Ps CvtPhPs(HalfSi h) { return _mm512_cvtph_ps(h); }
  TRIBUTARY_SIMD_TARGET static HalfSi CvtPsPh(Ps x) {
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  TRIBUTARY_SIMD_TARGET static HalfSi LowHalf(Si x) { return _mm512_castsi512_si256(x); }
  TRIBUTARY_SIMD_TARGET static HalfSi HighHalf(Si x) { return _mm512_extracti64x4_epi64(x, 1); }
  TRIBUTARY_SIMD_TARGET static Si Join(HalfSi lo, HalfSi hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  TRIBUTARY_SIMD_TARGET static Pd CvtEpi32Pd(HalfSi x) { return _mm512_cvtepi32_pd(x); }
  TRIBUTARY_SIMD_TARGET static HalfSi CvttPdEpi32(Pd x) { return _mm512_cvttpd_epi32(x); }
};

}  // namespace
}  // namespace tributary::dataplane::reduce_internal::avx512

namespace tributary::dataplane::reduce_internal {

const KernelTable* Avx512Kernels() {
  static const KernelTable table = avx512::MakeKernelTable<avx512::Avx512Traits>();
  return &table;
}

}  // namespace tributary::dataplane::reduce_internal

#else  // Not x86.

namespace tributary::dataplane::reduce_internal {
const KernelTable* Avx512Kernels() { return nullptr; }
}  // namespace tributary::dataplane::reduce_internal

#endif
