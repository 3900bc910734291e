// Linear layers over GGUF's Q4_1 and Q8_0 blocks on the CPU, with llama.cpp's arithmetic: each row of
// activations is quantised to 8 bits per 32 values, then every weight block meets it in one integer dot
// product (AVX-512 VNNI or AVX2 where the CPU has them, plain C++ elsewhere).
//
// The weights are GGUF's blocks with the rows interleaved eight at a time (see block_linear.interleave): for
// every block position, the scales of eight rows side by side, then their codes four bytes of each row in
// turn. One 32-byte load then holds four codes of each of eight rows, so a single multiply-add instruction
// advances eight output features at once, and the scales are vectors rather than scalars; this is ggml's
// "repacked" Q4_0x8 idea applied to Q4_1 and Q8_0. Sizes are unchanged: 20 bytes per 32 weights for Q4_1,
// 34 for Q8_0.
//
// Registered as torch.ops.kvasir_kernels.{q4_1_linear, q4_1f_linear, q8_0_linear, dequantize, block_rows}; see kernels/__init__.py.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVASIR_AVX2 1
// AVX-512's VNNI on 256-bit vectors: vpdpbusd multiplies unsigned by signed bytes and adds each four products
// into 32 bits in one instruction (three with plain AVX2), and AVX-512 has 32 vector registers instead of 16.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define KVASIR_VNNI 1
#endif
#endif

namespace {

constexpr int64_t kBlock = 32;  // weights per block
constexpr int kGroup = 8;       // rows interleaved together

// Eight rows' blocks at one block position. Row i's weight j is d[i] * q + m[i], with q its code:
// qs[32 c + 4 i + t] holds q_{4c+t} in the low nibble and q_{16+4c+t} in the high one (c < 4, t < 4).
struct GroupQ4_1 {
  uint16_t d[kGroup], m[kGroup];
  uint8_t qs[kGroup * 16];
};
// The same with float32 scales: GGUF's Q4_K, whose 32-weight sub-blocks have scales d * sc and minimums
// -dmin * m (a float16 times a 6-bit integer) that float16 can't hold exactly, but float32 can.
struct GroupQ4_1F {
  float d[kGroup], m[kGroup];
  uint8_t qs[kGroup * 16];
};
// Row i's weight j is d[i] * qs[32 k + 4 i + t] with j = 4k + t (k < 8, t < 4).
struct GroupQ8_0 {
  uint16_t d[kGroup];
  int8_t qs[kGroup * 32];
};
struct BlockQ8x {  // 32 activations: d * q_j, s = d * sum(q_j), and sum(q_j) itself
  float d, s;
  int32_t sum;
  int8_t qs[32];
};
static_assert(sizeof(GroupQ4_1) == kGroup * 20, "Q4_1 groups are 8 blocks of 20 bytes");
static_assert(sizeof(GroupQ8_0) == kGroup * 34, "Q8_0 groups are 8 blocks of 34 bytes");
static_assert(sizeof(GroupQ4_1F) == kGroup * 24, "Q4_1F groups are 8 blocks of 24 bytes");

inline float scale_value(uint16_t h) { return c10::detail::fp16_ieee_to_fp32_value(h); }
inline float scale_value(float f) { return f; }

inline float half_to_float(uint16_t h) { return c10::detail::fp16_ieee_to_fp32_value(h); }

#ifdef KVASIR_AVX2
// C's round() on eight floats: halves away from zero, as the plain loop below rounds. |x| - trunc(|x|) is exact,
// so comparing it with one half decides exactly (adding 0.5 first would round some values below one half up).
inline __m256 round_half_away(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256 magnitude = _mm256_andnot_ps(sign, x);
  const __m256 whole = _mm256_round_ps(magnitude, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 up = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(magnitude, whole), _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                  _mm256_set1_ps(1.f));
  return _mm256_or_ps(_mm256_add_ps(whole, up), _mm256_and_ps(x, sign));
}

inline float largest(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t total(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

// The plain loop's arithmetic, eight values at a time (the same products, the same rounding: the same codes).
void quantize_row(const float* x, BlockQ8x* out, int64_t blocks) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + b * kBlock + 8 * j);
    const __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                      _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    const float d = largest(amax) / 127.f;
    const __m256 inverse = _mm256_set1_ps(d > 0.f ? 1.f / d : 0.f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[j], inverse)));
    // packing interleaves the 128-bit halves; the permutation puts the 32 codes back in order
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const int32_t sum = total(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
    out[b].sum = sum;
  }
}
#else
void quantize_row(const float* x, BlockQ8x* out, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* v = x + b * kBlock;
    float amax = 0.f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.f;
    const float inverse = d > 0.f ? 1.f / d : 0.f;
    int sum = 0;
    for (int j = 0; j < kBlock; ++j) {
      const int q = static_cast<int>(std::round(v[j] * inverse));
      out[b].qs[j] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
    out[b].sum = sum;
  }
}
#endif

// Activations meet the weights in units: one row (BlockQ8x), or with AVX-512 two rows side by side (PairQ8x),
// so that one 512-bit vector holds eight output features of both. Up to kTile = 8 units meet each group of
// weights while its codes are in registers. With AVX-512's 32 vector registers, the eight codes vectors, the
// scales and the eight accumulators fit; AVX2 has 16, so some codes wait in L1, and still eight rows a tile
// measured 10% faster at 16 rows than four (the codes are unpacked half as often).
#ifdef KVASIR_VNNI
struct PairQ8x {  // rows 2u and 2u + 1 of one block position
  float d[2], s[2];
  int32_t offset[2];  // -128 * sum(q_j) of each row: see pair_q8_0
  int8_t qs[64];      // qs[8k + 4r + t]: row r's code 4k + t
};
using Unit = PairQ8x;
constexpr int kRowsPerUnit = 2;

void pack_pair(const BlockQ8x* first, const BlockQ8x* second, int64_t blocks, PairQ8x* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const BlockQ8x* rows[2] = {first + b, second ? second + b : nullptr};
    for (int r = 0; r < 2; ++r) {
      const BlockQ8x* a = rows[r];
      out[b].d[r] = a ? a->d : 0.f;
      out[b].s[r] = a ? a->s : 0.f;
      out[b].offset[r] = a ? -128 * a->sum : 0;
      for (int k = 0; k < 8; ++k) {
        if (a) {
          std::memcpy(out[b].qs + 8 * k + 4 * r, a->qs + 4 * k, 4);
        } else {
          std::memset(out[b].qs + 8 * k + 4 * r, 0, 4);
        }
      }
    }
  }
}
#else
using Unit = BlockQ8x;
constexpr int kRowsPerUnit = 1;
#endif
constexpr int kTile = 8;

#ifdef KVASIR_AVX2
inline __m256 scales(const uint16_t* h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}
inline __m256 scales(const float* f) { return _mm256_loadu_ps(f); }
inline __m256i four_bytes(const int8_t* q, int k) {
  int32_t v;
  std::memcpy(&v, q + 4 * k, 4);
  return _mm256_set1_epi32(v);
}

// Ask for the weights a few groups ahead: at one activation row the loop is as fast as memory delivers them,
// and the hardware prefetcher alone leaves it waiting at the start of every stretch.
template <typename Group>
inline void prefetch_ahead(const Group* g) {
  constexpr int kDistance = 1024;  // bytes
  const char* next = reinterpret_cast<const char*>(g) + kDistance;
  for (size_t line = 0; line < sizeof(Group); line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
}


#ifdef KVASIR_VNNI
// Eight rows' values, each twice: [v0, v0, v1, v1, ... v7, v7], lining up with a pair's two rows in turn.
inline __m512i twice(__m256i v) {
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                  _mm512_castsi256_si512(v));
}
inline __m512 twice(__m256 v) { return _mm512_castsi512_ps(twice(_mm256_castps_si256(v))); }
inline __m512i codes_twice(const uint8_t* q) { return twice(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))); }
inline __m512i codes_twice(const int8_t* q) { return codes_twice(reinterpret_cast<const uint8_t*>(q)); }
// A pair's two values side by side, repeated: [a0, a1, a0, a1, ...]
inline __m512 both(const float* two) {
  double v;
  std::memcpy(&v, two, 8);
  return _mm512_castpd_ps(_mm512_set1_pd(v));
}
inline __m512i both(const int32_t* two) { return _mm512_castps_si512(both(reinterpret_cast<const float*>(two))); }
inline __m512i eight_bytes(const int8_t* q, int k) {
  int64_t v;
  std::memcpy(&v, q + 8 * k, 8);
  return _mm512_set1_epi64(v);
}

// start + the dot products of eight rows' 32 unsigned codes (each twice) with a pair's 32 signed activations:
// lane 2i is row i times the pair's first row, lane 2i + 1 times its second. vpdpbusd adds four byte products
// into each 32-bit lane (no 16-bit step that could saturate); each waits for the one before (5 cycles), so
// with few pairs in a tile, too little other work to hide that, the chain is split in two.
template <int Pairs>
inline __m512i pair_dots(__m512i start, const __m512i* codes, const int8_t* activations) {
  if constexpr (Pairs < 4) {
    __m512i other = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
      start = _mm512_dpbusd_epi32(start, codes[k], eight_bytes(activations, k));
      other = _mm512_dpbusd_epi32(other, codes[k + 1], eight_bytes(activations, k + 1));
    }
    return _mm512_add_epi32(start, other);
  } else {
    for (int k = 0; k < 8; ++k) start = _mm512_dpbusd_epi32(start, codes[k], eight_bytes(activations, k));
    return start;
  }
}

// out[2p + r][i]: row i of the group times row r of pair p
template <int Pairs>
inline void store_pairs(const __m512* acc, float (*out)[kGroup]) {
  const __m512i apart = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int p = 0; p < Pairs; ++p) {
    const __m512 rows = _mm512_permutexvar_ps(apart, acc[p]);
    _mm256_storeu_ps(out[2 * p], _mm512_castps512_ps256(rows));
    _mm256_storeu_ps(out[2 * p + 1], _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(rows), 1)));
  }
}

// One activation row alone (a decode step of one sequence): 256-bit vectors, as a pair would leave half of each
// 512-bit vector idle. The dot products run in two chains (see pair_dots).
inline __m256i row_dots(__m256i start, const __m256i* codes, const int8_t* activations) {
  __m256i other = _mm256_setzero_si256();
  for (int k = 0; k < 8; k += 2) {
    start = _mm256_dpbusd_epi32(start, codes[k], four_bytes(activations, k));
    other = _mm256_dpbusd_epi32(other, codes[k + 1], four_bytes(activations, k + 1));
  }
  return _mm256_add_epi32(start, other);
}

template <typename Group>
void row_q4_1(const Group* w, const BlockQ8x* x, int64_t blocks, float* out) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const Group& g = w[b];
    prefetch_ahead(&g);
    __m256i codes[8];
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.qs + 32 * c));
      codes[c] = _mm256_and_si256(raw, low_nibbles);
      codes[c + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_nibbles);
    }
    const __m256 dots = _mm256_cvtepi32_ps(row_dots(_mm256_setzero_si256(), codes, x[b].qs));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(scales(g.d), _mm256_set1_ps(x[b].d)), dots, acc);
    acc = _mm256_fmadd_ps(scales(g.m), _mm256_set1_ps(x[b].s), acc);
  }
  _mm256_storeu_ps(out, acc);
}

void row_q8_0(const GroupQ8_0* w, const BlockQ8x* x, int64_t blocks, float* out) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));  // see group_q8_0
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const GroupQ8_0& g = w[b];
    prefetch_ahead(&g);
    __m256i codes[8];
    for (int k = 0; k < 8; ++k) {
      codes[k] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.qs + 32 * k)), flip);
    }
    const __m256 dots = _mm256_cvtepi32_ps(row_dots(_mm256_set1_epi32(-128 * x[b].sum), codes, x[b].qs));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(scales(g.d), _mm256_set1_ps(x[b].d)), dots, acc);
  }
  _mm256_storeu_ps(out, acc);
}

template <typename Group, int Pairs>
void group_q4_1(const Group* w, const PairQ8x* const* x, int64_t blocks, float (*out)[kGroup]) {
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  __m512 acc[Pairs];
  for (int p = 0; p < Pairs; ++p) acc[p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const Group& g = w[b];
    prefetch_ahead(&g);
    const __m512 d = twice(scales(g.d)), m = twice(scales(g.m));
    __m512i codes[8];  // codes[k]: codes 4k..4k+3 of each row, twice
    for (int c = 0; c < 4; ++c) {
      const __m512i raw = codes_twice(g.qs + 32 * c);
      codes[c] = _mm512_and_si512(raw, low_nibbles);
      codes[c + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low_nibbles);
    }
    for (int p = 0; p < Pairs; ++p) {
      const PairQ8x& a = x[p][b];
      const __m512 dots = _mm512_cvtepi32_ps(pair_dots<Pairs>(_mm512_setzero_si512(), codes, a.qs));
      acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(d, both(a.d)), dots, acc[p]);
      acc[p] = _mm512_fmadd_ps(m, both(a.s), acc[p]);
    }
  }
  store_pairs<Pairs>(acc, out);
}

template <int Pairs>
void group_q8_0(const GroupQ8_0* w, const PairQ8x* const* x, int64_t blocks, float (*out)[kGroup]) {
  // vpdpbusd wants one unsigned operand: the codes plus 128 (their top bit flipped), and each row's dot product
  // starts at -128 times the sum of its activations, which takes the offset out again exactly
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[Pairs];
  for (int p = 0; p < Pairs; ++p) acc[p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const GroupQ8_0& g = w[b];
    prefetch_ahead(&g);
    const __m512 d = twice(scales(g.d));
    __m512i codes[8];
    for (int k = 0; k < 8; ++k) codes[k] = _mm512_xor_si512(codes_twice(g.qs + 32 * k), flip);
    for (int p = 0; p < Pairs; ++p) {
      const PairQ8x& a = x[p][b];
      const __m512 dots = _mm512_cvtepi32_ps(pair_dots<Pairs>(both(a.offset), codes, a.qs));
      acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(d, both(a.d)), dots, acc[p]);
    }
  }
  store_pairs<Pairs>(acc, out);
}
#else
// out[r][i]: row i of the group times activation row r
template <typename Group, int Rows>
void group_q4_1(const Group* w, const BlockQ8x* const* x, int64_t blocks, float (*out)[kGroup]) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[Rows];
  for (int r = 0; r < Rows; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const Group& g = w[b];
    prefetch_ahead(&g);
    const __m256 d = scales(g.d), m = scales(g.m);
    __m256i codes[8];  // codes[k]: codes 4k..4k+3 of each row
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.qs + 32 * c));
      codes[c] = _mm256_and_si256(raw, low_nibbles);
      codes[c + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_nibbles);
    }
    for (int r = 0; r < Rows; ++r) {
      const BlockQ8x& a = x[r][b];
      // 16 products per 16-bit lane: at most 16 * 15 * 127 = 30480, so the lanes cannot overflow
      __m256i sums = _mm256_maddubs_epi16(codes[0], four_bytes(a.qs, 0));
      for (int k = 1; k < 8; ++k) sums = _mm256_add_epi16(sums, _mm256_maddubs_epi16(codes[k], four_bytes(a.qs, k)));
      const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, ones));
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(a.d)), dots, acc[r]);
      acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.s), acc[r]);
    }
  }
  for (int r = 0; r < Rows; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

template <int Rows>
void group_q8_0(const GroupQ8_0* w, const BlockQ8x* const* x, int64_t blocks, float (*out)[kGroup]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[Rows];
  for (int r = 0; r < Rows; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const GroupQ8_0& g = w[b];
    prefetch_ahead(&g);
    const __m256 d = scales(g.d);
    __m256i codes[8], magnitudes[8];
    for (int k = 0; k < 8; ++k) {
      codes[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.qs + 32 * k));
      magnitudes[k] = _mm256_sign_epi8(codes[k], codes[k]);
    }
    for (int r = 0; r < Rows; ++r) {
      const BlockQ8x& a = x[r][b];
      // maddubs multiplies unsigned by signed bytes: the weights' signs move onto the activations
      __m256i sums = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        const __m256i pairs =
            _mm256_maddubs_epi16(magnitudes[k], _mm256_sign_epi8(four_bytes(a.qs, k), codes[k]));
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, ones));
      }
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(a.d)), _mm256_cvtepi32_ps(sums), acc[r]);
    }
  }
  for (int r = 0; r < Rows; ++r) _mm256_storeu_ps(out[r], acc[r]);
}
#endif  // KVASIR_VNNI
#else
template <typename Group, int Rows>
void group_q4_1(const Group* w, const BlockQ8x* const* x, int64_t blocks, float (*out)[kGroup]) {
  for (int r = 0; r < Rows; ++r) {
    for (int i = 0; i < kGroup; ++i) {
      float total = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        const BlockQ8x& a = x[r][b];
        int sum = 0;
        for (int c = 0; c < 4; ++c) {
          for (int t = 0; t < 4; ++t) {
            const uint8_t byte = w[b].qs[32 * c + 4 * i + t];
            sum += (byte & 0x0F) * a.qs[4 * c + t] + (byte >> 4) * a.qs[16 + 4 * c + t];
          }
        }
        total += scale_value(w[b].d[i]) * a.d * static_cast<float>(sum) + scale_value(w[b].m[i]) * a.s;
      }
      out[r][i] = total;
    }
  }
}

template <int Rows>
void group_q8_0(const GroupQ8_0* w, const BlockQ8x* const* x, int64_t blocks, float (*out)[kGroup]) {
  for (int r = 0; r < Rows; ++r) {
    for (int i = 0; i < kGroup; ++i) {
      float total = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        int sum = 0;
        for (int k = 0; k < 8; ++k) {
          for (int t = 0; t < 4; ++t) sum += w[b].qs[32 * k + 4 * i + t] * x[r][b].qs[4 * k + t];
        }
        total += half_to_float(w[b].d[i]) * x[r][b].d * static_cast<float>(sum);
      }
      out[r][i] = total;
    }
  }
}
#endif

template <typename Group>
struct GroupDots {
  using Fn = void (*)(const Group*, const Unit* const*, int64_t, float (*)[kGroup]);
  Fn by_units[kTile];  // by_units[k]: k + 1 units of activations at once
#ifdef KVASIR_VNNI
  void (*one_row)(const Group*, const BlockQ8x*, int64_t, float*);
#endif
};
#ifdef KVASIR_VNNI
template <typename Group, size_t... Units>
constexpr GroupDots<Group> q4_1_dots(std::index_sequence<Units...>) {
  return {{group_q4_1<Group, Units + 1>...}, row_q4_1<Group>};
}
template <size_t... Units>
constexpr GroupDots<GroupQ8_0> q8_0_dots(std::index_sequence<Units...>) {
  return {{group_q8_0<Units + 1>...}, row_q8_0};
}
#else
template <typename Group, size_t... Units>
constexpr GroupDots<Group> q4_1_dots(std::index_sequence<Units...>) {
  return {{group_q4_1<Group, Units + 1>...}};
}
template <size_t... Units>
constexpr GroupDots<GroupQ8_0> q8_0_dots(std::index_sequence<Units...>) {
  return {{group_q8_0<Units + 1>...}};
}
#endif
const GroupDots<GroupQ4_1> kQ4_1 = q4_1_dots<GroupQ4_1>(std::make_index_sequence<kTile>());
const GroupDots<GroupQ4_1F> kQ4_1F = q4_1_dots<GroupQ4_1F>(std::make_index_sequence<kTile>());
const GroupDots<GroupQ8_0> kQ8_0 = q8_0_dots(std::make_index_sequence<kTile>());

// at least ~4k block products per task, so small layers do not pay for waking threads they can't use
inline int64_t grain_for(int64_t blocks, int64_t rows) {
  return std::max<int64_t>(1, 4096 / std::max<int64_t>(1, kGroup * blocks * rows));
}

#ifdef KVASIR_VNNI
template <typename Group, typename Fn>
at::Tensor one_row(const at::Tensor& input, const Group* weights, int64_t groups, int64_t blocks,
                   int64_t out_features, Fn fn) {
  std::vector<BlockQ8x> quantized(static_cast<size_t>(blocks));
  quantize_row(input.data_ptr<float>(), quantized.data(), blocks);
  at::Tensor output = at::empty({1, out_features}, input.options());
  float* out = output.data_ptr<float>();
  at::parallel_for(0, groups, grain_for(blocks, 1), [&](int64_t begin, int64_t end) {
    float results[kGroup];
    for (int64_t g = begin; g < end; ++g) {
      fn(weights + g * blocks, quantized.data(), blocks, results);
      const int64_t first = g * kGroup;
      std::memcpy(out + first, results, std::min<int64_t>(kGroup, out_features - first) * sizeof(float));
    }
  });
  return output;
}
#endif

template <typename Group>
at::Tensor block_linear(const at::Tensor& input, const at::Tensor& weight_groups, int64_t in_features,
                        int64_t out_features, const GroupDots<Group>& dots) {
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kFloat && input.is_contiguous(),
              "activations must be a contiguous float32 [rows, in_features] tensor");
  TORCH_CHECK(input.size(1) == in_features && in_features % kBlock == 0,
              "activations have ", input.size(1), " features, the weights ", in_features);
  const int64_t blocks = in_features / kBlock;
  const int64_t groups = (out_features + kGroup - 1) / kGroup;
  TORCH_CHECK(weight_groups.scalar_type() == at::kByte && weight_groups.is_contiguous() &&
                  weight_groups.dim() == 2 && weight_groups.size(0) == groups &&
                  weight_groups.size(1) == blocks * static_cast<int64_t>(sizeof(Group)),
              "weight blocks must be contiguous uint8 [", groups, ", ", blocks * sizeof(Group),
              "] (eight rows interleaved) for ", out_features, " x ", in_features, " weights");
  const int64_t rows = input.size(0);

  const auto* weights = reinterpret_cast<const Group*>(weight_groups.data_ptr<uint8_t>());
#ifdef KVASIR_VNNI
  if (rows == 1) return one_row(input, weights, groups, blocks, out_features, dots.one_row);
#endif
  const int64_t units = (rows + kRowsPerUnit - 1) / kRowsPerUnit;
  std::vector<Unit> quantized(static_cast<size_t>(units * blocks));
  const float* x = input.data_ptr<float>();
  at::parallel_for(0, units, 16, [&](int64_t begin, int64_t end) {
#ifdef KVASIR_VNNI
    std::vector<BlockQ8x> two(static_cast<size_t>(2 * blocks));
    for (int64_t u = begin; u < end; ++u) {
      const bool second = 2 * u + 1 < rows;
      quantize_row(x + 2 * u * in_features, two.data(), blocks);
      if (second) quantize_row(x + (2 * u + 1) * in_features, two.data() + blocks, blocks);
      pack_pair(two.data(), second ? two.data() + blocks : nullptr, blocks, quantized.data() + u * blocks);
    }
#else
    for (int64_t r = begin; r < end; ++r) quantize_row(x + r * in_features, quantized.data() + r * blocks, blocks);
#endif
  });

  at::Tensor output = at::empty({rows, out_features}, input.options());
  float* out = output.data_ptr<float>();
  at::parallel_for(0, groups, grain_for(blocks, rows), [&](int64_t begin, int64_t end) {
    const Unit* tile[kTile];
    float results[kTile * kRowsPerUnit][kGroup];
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * kGroup;
      const int64_t width = std::min<int64_t>(kGroup, out_features - first);
      for (int64_t u0 = 0; u0 < units; u0 += kTile) {
        const int count = static_cast<int>(std::min<int64_t>(kTile, units - u0));
        for (int k = 0; k < count; ++k) tile[k] = quantized.data() + (u0 + k) * blocks;
        dots.by_units[count - 1](weights + g * blocks, tile, blocks, results);
        const int64_t r0 = u0 * kRowsPerUnit, done = std::min<int64_t>(count * kRowsPerUnit, rows - r0);
        for (int64_t k = 0; k < done; ++k) {
          std::memcpy(out + (r0 + k) * out_features + first, results[k], width * sizeof(float));
        }
      }
    }
  });
  return output;
}

}  // namespace

namespace kvasir {

at::Tensor q4_1_linear(const at::Tensor& input, const at::Tensor& weight_groups, int64_t in_features,
                       int64_t out_features) {
  return block_linear(input, weight_groups, in_features, out_features, kQ4_1);
}

at::Tensor q8_0_linear(const at::Tensor& input, const at::Tensor& weight_groups, int64_t in_features,
                       int64_t out_features) {
  return block_linear(input, weight_groups, in_features, out_features, kQ8_0);
}

at::Tensor q4_1f_linear(const at::Tensor& input, const at::Tensor& weight_groups, int64_t in_features,
                        int64_t out_features) {
  return block_linear(input, weight_groups, in_features, out_features, kQ4_1F);
}

at::Tensor activation_remainder(const at::Tensor& input) {
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kFloat && input.is_contiguous() &&
                  input.size(1) % kBlock == 0,
              "activations must be a contiguous float32 [rows, in_features] tensor of whole 32-value blocks");
  const int64_t rows = input.size(0), features = input.size(1), blocks = features / kBlock;
  at::Tensor out = at::empty_like(input);
  const float* x = input.data_ptr<float>();
  float* rest = out.data_ptr<float>();
  std::vector<BlockQ8x> codes(static_cast<size_t>(blocks));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(x + r * features, codes.data(), blocks);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t j = 0; j < kBlock; ++j) {
        const int64_t i = r * features + b * kBlock + j;
        rest[i] = x[i] - static_cast<float>(codes[b].qs[j]) * codes[b].d;
      }
    }
  }
  return out;
}

}  // namespace kvasir

namespace {

template <typename Group>
void dequantize_q4_1(const Group& group, int64_t i, float* values) {
  const float d = scale_value(group.d[i]), m = scale_value(group.m[i]);
  for (int c = 0; c < 4; ++c) {
    for (int t = 0; t < 4; ++t) {
      const uint8_t byte = group.qs[32 * c + 4 * i + t];
      values[4 * c + t] = d * static_cast<float>(byte & 0x0F) + m;
      values[16 + 4 * c + t] = d * static_cast<float>(byte >> 4) + m;
    }
  }
}

void dequantize_q8_0(const GroupQ8_0& group, int64_t i, float* values) {
  const float d = scale_value(group.d[i]);
  for (int k = 0; k < 8; ++k) {
    for (int t = 0; t < 4; ++t) values[4 * k + t] = d * static_cast<float>(group.qs[32 * k + 4 * i + t]);
  }
}

template <typename Group, typename Fn>
at::Tensor dequantize_groups(const at::Tensor& weight_groups, int64_t in_features, int64_t out_features,
                             const c10::optional<at::Tensor>& rows, Fn fn) {
  TORCH_CHECK(in_features % kBlock == 0, "in_features must be a multiple of 32");
  const int64_t blocks = in_features / kBlock, groups = (out_features + kGroup - 1) / kGroup;
  TORCH_CHECK(weight_groups.scalar_type() == at::kByte && weight_groups.is_contiguous() &&
                  weight_groups.dim() == 2 && weight_groups.size(0) == groups &&
                  weight_groups.size(1) == blocks * static_cast<int64_t>(sizeof(Group)),
              "weight blocks do not hold ", out_features, " x ", in_features, " weights");
  const int64_t* picked = nullptr;
  int64_t count = out_features;
  if (rows.has_value()) {
    TORCH_CHECK(rows->scalar_type() == at::kLong && rows->is_contiguous() && rows->dim() == 1,
                "rows must be a contiguous int64 vector");
    picked = rows->data_ptr<int64_t>();
    count = rows->numel();
    for (int64_t r = 0; r < count; ++r) {
      TORCH_CHECK(picked[r] >= 0 && picked[r] < out_features, "row ", picked[r], " is outside 0..", out_features - 1);
    }
  }
  at::Tensor output = at::empty({count, in_features}, weight_groups.options().dtype(at::kFloat));
  float* out = output.data_ptr<float>();
  const auto* all = reinterpret_cast<const Group*>(weight_groups.data_ptr<uint8_t>());
  at::parallel_for(0, count, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = picked ? picked[r] : r;
      for (int64_t b = 0; b < blocks; ++b) fn(all[n / kGroup * blocks + b], n % kGroup, out + r * in_features + b * kBlock);
    }
  });
  return output;
}

}  // namespace

namespace kvasir {

// The float32 weights [out_features, in_features] of interleaved "q4_1", "q4_1f" or "q8_0" blocks; with `rows`
// (int64 row numbers), only those rows, [rows.numel(), in_features]: an embedding lookup.
at::Tensor dequantize_rows(const at::Tensor& weight_groups, int64_t in_features, int64_t out_features,
                           c10::string_view kind, const c10::optional<at::Tensor>& rows) {
  if (kind == "q4_1") {
    return dequantize_groups<GroupQ4_1>(weight_groups, in_features, out_features, rows, dequantize_q4_1<GroupQ4_1>);
  }
  if (kind == "q4_1f") {
    return dequantize_groups<GroupQ4_1F>(weight_groups, in_features, out_features, rows, dequantize_q4_1<GroupQ4_1F>);
  }
  TORCH_CHECK(kind == "q8_0", "unknown block kind ", kind);
  return dequantize_groups<GroupQ8_0>(weight_groups, in_features, out_features, rows, dequantize_q8_0);
}

at::Tensor dequantize(const at::Tensor& weight_groups, int64_t in_features, int64_t out_features,
                      c10::string_view kind) {
  return dequantize_rows(weight_groups, in_features, out_features, kind, c10::nullopt);
}

at::Tensor block_rows(const at::Tensor& weight_groups, const at::Tensor& rows, int64_t in_features,
                      int64_t out_features, c10::string_view kind) {
  return dequantize_rows(weight_groups, in_features, out_features, kind, rows);
}

}  // namespace kvasir

TORCH_LIBRARY(kvasir_kernels, m) {
  m.def("q4_1_linear(Tensor input, Tensor weight_blocks, int in_features, int out_features) -> Tensor");
  m.def("q8_0_linear(Tensor input, Tensor weight_blocks, int in_features, int out_features) -> Tensor");
  m.def("q4_1f_linear(Tensor input, Tensor weight_blocks, int in_features, int out_features) -> Tensor");
  m.def("activation_remainder(Tensor input) -> Tensor");
  m.def("dequantize(Tensor weight_blocks, int in_features, int out_features, str kind) -> Tensor");
  m.def("block_rows(Tensor weight_blocks, Tensor rows, int in_features, int out_features, str kind) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvasir_kernels, CPU, m) {
  m.impl("q4_1_linear", kvasir::q4_1_linear);
  m.impl("q8_0_linear", kvasir::q8_0_linear);
  m.impl("q4_1f_linear", kvasir::q4_1f_linear);
  m.impl("activation_remainder", kvasir::activation_remainder);
  m.impl("dequantize", kvasir::dequantize);
  m.impl("block_rows", kvasir::block_rows);
}
