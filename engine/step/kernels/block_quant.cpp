// Linear layers over GGUF's Q4_1 and Q8_0 blocks on the CPU, the way llama.cpp computes them: each row of
// activations is quantised to 8 bits per 32 values, then every weight block meets it in one integer dot
// product (AVX2 where the CPU has it, plain C++ elsewhere). The weights are read as they are stored: 20 bytes
// per 32 weights for Q4_1, 34 for Q8_0.
//
// Registered as torch.ops.kvasir_kernels.{q4_1_linear, q8_0_linear, dequantize}; see kernels/__init__.py.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVASIR_AVX2 1
#endif

namespace {

constexpr int64_t kBlock = 32;

struct BlockQ4_1 {  // weight j: d * q_j + m; byte j holds q_j (low nibble) and q_{j+16} (high nibble)
  uint16_t d, m;
  uint8_t qs[16];
};
struct BlockQ8_0 {  // weight j: d * q_j
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ8x {  // 32 activations: d * q_j, and s = d * sum(q_j)
  float d, s;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 blocks are 20 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 blocks are 34 bytes");

inline float half_to_float(uint16_t h) { return c10::detail::fp16_ieee_to_fp32_value(h); }

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
  }
}

#ifdef KVASIR_AVX2
inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// 32 products of unsigned bytes with signed bytes, summed into 8 int32 lanes, as floats
inline __m256 dot_bytes(__m256i unsigned_bytes, __m256i signed_bytes) {
  const __m256i pairs = _mm256_maddubs_epi16(unsigned_bytes, signed_bytes);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif

// Products of one weight row with up to kTile activation rows: each weight block is read and unpacked once.
constexpr int kTile = 4;

#ifdef KVASIR_AVX2
inline float to_float(uint16_t h) { return _cvtsh_ss(h); }

template <int Rows>
void dot_q4_1(const BlockQ4_1* w, const BlockQ8x* const* x, int64_t blocks, float* out) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  __m256 acc[Rows];
  float offsets[Rows];
  for (int r = 0; r < Rows; ++r) acc[r] = _mm256_setzero_ps(), offsets[r] = 0.f;
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = to_float(w[b].d), m = to_float(w[b].m);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs));
    const __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low_nibbles);
    for (int r = 0; r < Rows; ++r) {
      const BlockQ8x& a = x[r][b];
      const __m256i activations = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), dot_bytes(codes, activations), acc[r]);
      offsets[r] += m * a.s;
    }
  }
  for (int r = 0; r < Rows; ++r) out[r] = horizontal_sum(acc[r]) + offsets[r];
}

template <int Rows>
void dot_q8_0(const BlockQ8_0* w, const BlockQ8x* const* x, int64_t blocks, float* out) {
  __m256 acc[Rows];
  for (int r = 0; r < Rows; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = to_float(w[b].d);
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    // maddubs multiplies unsigned by signed bytes: move the weights' signs onto the activations
    const __m256i magnitudes = _mm256_sign_epi8(codes, codes);
    for (int r = 0; r < Rows; ++r) {
      const BlockQ8x& a = x[r][b];
      const __m256i activations = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs));
      const __m256i signed_activations = _mm256_sign_epi8(activations, codes);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), dot_bytes(magnitudes, signed_activations), acc[r]);
    }
  }
  for (int r = 0; r < Rows; ++r) out[r] = horizontal_sum(acc[r]);
}
#else
inline float to_float(uint16_t h) { return half_to_float(h); }

template <int Rows>
void dot_q4_1(const BlockQ4_1* w, const BlockQ8x* const* x, int64_t blocks, float* out) {
  for (int r = 0; r < Rows; ++r) {
    float total = 0.f;
    for (int64_t b = 0; b < blocks; ++b) {
      const BlockQ8x& a = x[r][b];
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += (w[b].qs[j] & 0x0F) * a.qs[j] + (w[b].qs[j] >> 4) * a.qs[j + 16];
      total += to_float(w[b].d) * a.d * static_cast<float>(sum) + to_float(w[b].m) * a.s;
    }
    out[r] = total;
  }
}

template <int Rows>
void dot_q8_0(const BlockQ8_0* w, const BlockQ8x* const* x, int64_t blocks, float* out) {
  for (int r = 0; r < Rows; ++r) {
    float total = 0.f;
    for (int64_t b = 0; b < blocks; ++b) {
      int sum = 0;
      for (int j = 0; j < kBlock; ++j) sum += w[b].qs[j] * x[r][b].qs[j];
      total += to_float(w[b].d) * x[r][b].d * static_cast<float>(sum);
    }
    out[r] = total;
  }
}
#endif

template <typename Block>
struct Dots {
  using Fn = void (*)(const Block*, const BlockQ8x* const*, int64_t, float*);
  Fn by_rows[kTile];  // by_rows[k]: k + 1 activation rows at once
};
const Dots<BlockQ4_1> kQ4_1{{dot_q4_1<1>, dot_q4_1<2>, dot_q4_1<3>, dot_q4_1<4>}};
const Dots<BlockQ8_0> kQ8_0{{dot_q8_0<1>, dot_q8_0<2>, dot_q8_0<3>, dot_q8_0<4>}};

template <typename Block>
at::Tensor block_linear(const at::Tensor& input, const at::Tensor& weight_blocks, int64_t in_features,
                        const Dots<Block>& dots) {
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kFloat && input.is_contiguous(),
              "activations must be a contiguous float32 [rows, in_features] tensor");
  TORCH_CHECK(input.size(1) == in_features && in_features % kBlock == 0,
              "activations have ", input.size(1), " features, the weights ", in_features);
  const int64_t blocks = in_features / kBlock;
  TORCH_CHECK(weight_blocks.scalar_type() == at::kByte && weight_blocks.is_contiguous() && weight_blocks.dim() == 2 &&
                  weight_blocks.size(1) == blocks * static_cast<int64_t>(sizeof(Block)),
              "weight blocks must be contiguous uint8 [out_features, in_features / 32 * ", sizeof(Block), "]");
  const int64_t rows = input.size(0);
  const int64_t out_features = weight_blocks.size(0);

  std::vector<BlockQ8x> quantized(static_cast<size_t>(rows * blocks));
  const float* x = input.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) quantize_row(x + r * in_features, quantized.data() + r * blocks, blocks);
  });

  at::Tensor output = at::empty({rows, out_features}, input.options());
  float* out = output.data_ptr<float>();
  const auto* weights = reinterpret_cast<const Block*>(weight_blocks.data_ptr<uint8_t>());
  // at least ~4k block products per task, so small layers do not pay for waking threads they can't use
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, blocks * rows));
  at::parallel_for(0, out_features, grain, [&](int64_t begin, int64_t end) {
    const BlockQ8x* tile[kTile];
    float results[kTile];
    for (int64_t n = begin; n < end; ++n) {
      const Block* row = weights + n * blocks;
      for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
        const int count = static_cast<int>(std::min<int64_t>(kTile, rows - r0));
        for (int k = 0; k < count; ++k) tile[k] = quantized.data() + (r0 + k) * blocks;
        dots.by_rows[count - 1](row, tile, blocks, results);
        for (int k = 0; k < count; ++k) out[(r0 + k) * out_features + n] = results[k];
      }
    }
  });
  return output;
}

}  // namespace

namespace kvasir {

at::Tensor q4_1_linear(const at::Tensor& input, const at::Tensor& weight_blocks, int64_t in_features) {
  return block_linear(input, weight_blocks, in_features, kQ4_1);
}

at::Tensor q8_0_linear(const at::Tensor& input, const at::Tensor& weight_blocks, int64_t in_features) {
  return block_linear(input, weight_blocks, in_features, kQ8_0);
}

// The float32 weights [out_features, in_features] of Q4_1 ("q4_1") or Q8_0 ("q8_0") blocks.
at::Tensor dequantize(const at::Tensor& weight_blocks, int64_t in_features, c10::string_view kind) {
  TORCH_CHECK(weight_blocks.scalar_type() == at::kByte && weight_blocks.is_contiguous() && weight_blocks.dim() == 2,
              "weight blocks must be a contiguous uint8 matrix");
  TORCH_CHECK(in_features % kBlock == 0, "in_features must be a multiple of 32");
  const bool is_q4 = kind == "q4_1";
  TORCH_CHECK(is_q4 || kind == "q8_0", "unknown block kind ", kind);
  const int64_t blocks = in_features / kBlock;
  const int64_t out_features = weight_blocks.size(0);
  TORCH_CHECK(weight_blocks.size(1) == blocks * static_cast<int64_t>(is_q4 ? sizeof(BlockQ4_1) : sizeof(BlockQ8_0)),
              "weight blocks do not match in_features");
  at::Tensor output = at::empty({out_features, in_features}, weight_blocks.options().dtype(at::kFloat));
  float* out = output.data_ptr<float>();
  const uint8_t* raw = weight_blocks.data_ptr<uint8_t>();
  at::parallel_for(0, out_features * blocks, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* values = out + i * kBlock;
      if (is_q4) {
        const auto& block = reinterpret_cast<const BlockQ4_1*>(raw)[i];
        const float d = half_to_float(block.d), m = half_to_float(block.m);
        for (int j = 0; j < 16; ++j) {
          values[j] = d * static_cast<float>(block.qs[j] & 0x0F) + m;
          values[j + 16] = d * static_cast<float>(block.qs[j] >> 4) + m;
        }
      } else {
        const auto& block = reinterpret_cast<const BlockQ8_0*>(raw)[i];
        const float d = half_to_float(block.d);
        for (int j = 0; j < kBlock; ++j) values[j] = d * static_cast<float>(block.qs[j]);
      }
    }
  });
  return output;
}

}  // namespace kvasir

TORCH_LIBRARY(kvasir_kernels, m) {
  m.def("q4_1_linear(Tensor input, Tensor weight_blocks, int in_features) -> Tensor");
  m.def("q8_0_linear(Tensor input, Tensor weight_blocks, int in_features) -> Tensor");
  m.def("dequantize(Tensor weight_blocks, int in_features, str kind) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvasir_kernels, CPU, m) {
  m.impl("q4_1_linear", kvasir::q4_1_linear);
  m.impl("q8_0_linear", kvasir::q8_0_linear);
  m.impl("dequantize", kvasir::dequantize);
}
