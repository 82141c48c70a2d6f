// AVX2 + F16C vector traits for the kernels in kernels_simd.h. Heads and tails run the scalar
// reference. Every function that uses the instructions carries the target attribute, so this
// file builds with the project's baseline flags and only runs after a CPU check (cpu_reducer.cc).
#include "dataplane/reduce/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define TRIBUTARY_SIMD_TARGET __attribute__((target("avx2,f16c")))
#define TRIBUTARY_SIMD_NAMESPACE avx2
#include "dataplane/reduce/cpu/kernels_simd.h"

namespace tributary::dataplane::reduce_internal::avx2 {
namespace {

struct Avx2Traits {
  static constexpr std::string_view kIsa = "avx2";
  static constexpr size_t kBytes = 32;
  static constexpr bool kMasked = false;
  using Ps = __m256;
  using Pd = __m256d;
  using Si = __m256i;
  using HalfSi = __m128i;

  TRIBUTARY_SIMD_TARGET static Ps LoadPs(const char* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  TRIBUTARY_SIMD_TARGET static void StorePs(char* p, Ps v) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
  }
  TRIBUTARY_SIMD_TARGET static Pd LoadPd(const char* p) {
    return _mm256_loadu_pd(reinterpret_cast<const double*>(p));
  }
  TRIBUTARY_SIMD_TARGET static void StorePd(char* p, Pd v) {
    _mm256_storeu_pd(reinterpret_cast<double*>(p), v);
  }
  TRIBUTARY_SIMD_TARGET static Si LoadSi(const char* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  TRIBUTARY_SIMD_TARGET static void StoreSi(char* p, Si v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  TRIBUTARY_SIMD_TARGET static HalfSi LoadHalfSi(const char* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  TRIBUTARY_SIMD_TARGET static void StoreHalfSi(char* p, HalfSi v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  }

  TRIBUTARY_SIMD_TARGET static Ps Add(Ps a, Ps b) { return _mm256_add_ps(a, b); }
  TRIBUTARY_SIMD_TARGET static Pd Add(Pd a, Pd b) { return _mm256_add_pd(a, b); }
  TRIBUTARY_SIMD_TARGET static Ps Div(Ps a, Ps b) { return _mm256_div_ps(a, b); }
  TRIBUTARY_SIMD_TARGET static Pd Div(Pd a, Pd b) { return _mm256_div_pd(a, b); }
  TRIBUTARY_SIMD_TARGET static Ps Set1(float x) { return _mm256_set1_ps(x); }
  TRIBUTARY_SIMD_TARGET static Pd Set1(double x) { return _mm256_set1_pd(x); }
  TRIBUTARY_SIMD_TARGET static Ps Canonicalize(Ps x) {
    const Ps nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kCanonicalNanF32)));
    return _mm256_blendv_ps(x, nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  TRIBUTARY_SIMD_TARGET static Pd Canonicalize(Pd x) {
    const Pd nan =
        _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(kCanonicalNanF64)));
    return _mm256_blendv_pd(x, nan, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
  }

  TRIBUTARY_SIMD_TARGET static Si AddEpi32(Si a, Si b) { return _mm256_add_epi32(a, b); }
  TRIBUTARY_SIMD_TARGET static Si AddEpi64(Si a, Si b) { return _mm256_add_epi64(a, b); }
  TRIBUTARY_SIMD_TARGET static Si AndSi(Si a, Si b) { return _mm256_and_si256(a, b); }
  TRIBUTARY_SIMD_TARGET static Si Set1Epi32(int x) { return _mm256_set1_epi32(x); }
  TRIBUTARY_SIMD_TARGET static Si ZeroSi() { return _mm256_setzero_si256(); }
  template <int kShift>
  TRIBUTARY_SIMD_TARGET static Si SrliEpi32(Si x) {
    return _mm256_srli_epi32(x, kShift);
  }
  TRIBUTARY_SIMD_TARGET static Si CastPsSi(Ps x) { return _mm256_castps_si256(x); }
  TRIBUTARY_SIMD_TARGET static Ps CastSiPs(Si x) { return _mm256_castsi256_ps(x); }
  TRIBUTARY_SIMD_TARGET static Si UnpackLoEpi16(Si a, Si b) { return _mm256_unpacklo_epi16(a, b); }
  TRIBUTARY_SIMD_TARGET static Si UnpackHiEpi16(Si a, Si b) { return _mm256_unpackhi_epi16(a, b); }
  TRIBUTARY_SIMD_TARGET static Si PackusEpi32(Si a, Si b) { return _mm256_packus_epi32(a, b); }

  TRIBUTARY_SIMD_TARGET static Ps CvtPhPs(HalfSi h) { return _mm256_cvtph_ps(h); }
  TRIBUTARY_SIMD_TARGET static HalfSi CvtPsPh(Ps x) {
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  TRIBUTARY_SIMD_TARGET static HalfSi LowHalf(Si x) { return _mm256_castsi256_si128(x); }
  TRIBUTARY_SIMD_TARGET static HalfSi HighHalf(Si x) { return _mm256_extracti128_si256(x, 1); }
  TRIBUTARY_SIMD_TARGET static Si Join(HalfSi lo, HalfSi hi) { return _mm256_set_m128i(hi, lo); }
  TRIBUTARY_SIMD_TARGET static Pd CvtEpi32Pd(HalfSi x) { return _mm256_cvtepi32_pd(x); }
  TRIBUTARY_SIMD_TARGET static HalfSi CvttPdEpi32(Pd x) { return _mm256_cvttpd_epi32(x); }
};

}  // namespace
}  // namespace tributary::dataplane::reduce_internal::avx2

namespace tributary::dataplane::reduce_internal {

const KernelTable* Avx2Kernels() {
  static const KernelTable table = avx2::MakeKernelTable<avx2::Avx2Traits>();
  return &table;
}

}  // namespace tributary::dataplane::reduce_internal

#else  // Not x86.

namespace tributary::dataplane::reduce_internal {
const KernelTable* Avx2Kernels() { return nullptr; }
}  // namespace tributary::dataplane::reduce_internal

#endif
