// A float32 linear layer for a few rows of activations: decode steps (one row per reply) and the checks of
// speculative decoding (a draft of k tokens is k + 1 rows). torch's CPU gemm is tuned for many rows; for two to
// sixteen it reads the weights at a third of the speed of one row's matrix-vector product, so a check of four
// rows cost three plain steps. Here each group of weight rows is read from memory once and meets every row of
// activations while it is in the L1 cache, so a step of a few rows costs little more than one.
//
// Every output is one sum per vector lane over the inputs in order (8 lanes, 16 in the AVX-512 build), then the
// lanes added in a fixed order: a row's result does not depend on how many rows came with it, so a reply's check
// computes exactly what its plain step would. (The builds round differently from one another, as any two
// summation orders do; one process loads one build.)
//
// Registered as torch.ops.kvasir_kernels.float_linear; see kernels/__init__.py and step/float_linear.py.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#define KVASIR_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVASIR_AVX2 1
#endif

namespace {

constexpr int64_t kRowGroup = 4;  // weight rows read together: four streams from memory at once

#if defined(KVASIR_AVX512)
// 32 vector registers: 4 weight rows x 6 activation rows of sums, the four rows' weights and an input
constexpr int64_t kLanes = 16;
constexpr int kTileRows = 6;
using Lanes = __m512;
inline Lanes zero() { return _mm512_setzero_ps(); }
inline Lanes load(const float* p) { return _mm512_loadu_ps(p); }
inline Lanes multiply_add(Lanes a, Lanes b, Lanes c) { return _mm512_fmadd_ps(a, b, c); }
inline float lane_sum(Lanes v) {  // halves, then as AVX2 does: halves, pairs, the last two
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(v),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 low = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
  low = _mm_add_ps(low, _mm_movehl_ps(low, low));
  return _mm_cvtss_f32(_mm_add_ss(low, _mm_movehdup_ps(low)));
}
#elif defined(KVASIR_AVX2)
// 16 vector registers: 4 x 3 sums, and the weights as memory operands where registers run out
constexpr int64_t kLanes = 8;
constexpr int kTileRows = 3;
using Lanes = __m256;
inline Lanes zero() { return _mm256_setzero_ps(); }
inline Lanes load(const float* p) { return _mm256_loadu_ps(p); }
inline Lanes multiply_add(Lanes a, Lanes b, Lanes c) { return _mm256_fmadd_ps(a, b, c); }
inline float lane_sum(Lanes v) {
  __m128 low = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  low = _mm_add_ps(low, _mm_movehl_ps(low, low));
  return _mm_cvtss_f32(_mm_add_ss(low, _mm_movehdup_ps(low)));
}
#else
constexpr int64_t kLanes = 8;
constexpr int kTileRows = 3;
struct Lanes {
  float v[kLanes];
};
inline Lanes zero() { return Lanes{}; }
inline Lanes load(const float* p) {
  Lanes out;
  for (int64_t u = 0; u < kLanes; ++u) out.v[u] = p[u];
  return out;
}
inline Lanes multiply_add(Lanes a, Lanes b, Lanes c) {
  for (int64_t u = 0; u < kLanes; ++u) c.v[u] += a.v[u] * b.v[u];
  return c;
}
inline float lane_sum(Lanes v) {  // the AVX2 order: halves, then pairs, then the last two
  float h[4];
  for (int u = 0; u < 4; ++u) h[u] = v.v[u] + v.v[u + 4];
  return (h[0] + h[2]) + (h[1] + h[3]);
}
#endif

// out[m][r] = x[m] . w[r] for R weight rows and M activation rows (R * M sums held in registers)
template <int R, int M>
void tile(const float* x, int64_t in_features, const float* const* w, float* out, int64_t out_stride) {
  Lanes sums[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) sums[m][r] = zero();
  int64_t k = 0;
  for (; k + kLanes <= in_features; k += kLanes) {
    Lanes weights[R];
    for (int r = 0; r < R; ++r) weights[r] = load(w[r] + k);
    for (int m = 0; m < M; ++m) {
      Lanes input = load(x + m * in_features + k);
      for (int r = 0; r < R; ++r) sums[m][r] = multiply_add(weights[r], input, sums[m][r]);
    }
  }
  for (int m = 0; m < M; ++m) {
    for (int r = 0; r < R; ++r) {
      float total = lane_sum(sums[m][r]);
      for (int64_t j = k; j < in_features; ++j) total += w[r][j] * x[m * in_features + j];
      out[m * out_stride + r] = total;
    }
  }
}

// The last `rows` (fewer than M) activation rows against R weight rows: one tile of exactly that many
template <int R, int M>
void rest_against(const float* x, int64_t rows, int64_t in_features, const float* const* w, float* out,
                  int64_t out_stride) {
  if constexpr (M > 1) {
    if (rows == M - 1) {
      tile<R, M - 1>(x, in_features, w, out, out_stride);
    } else {
      rest_against<R, M - 1>(x, rows, in_features, w, out, out_stride);
    }
  }
}

// Every activation row against R weight rows: kTileRows rows at a time, then one tile of the rest
template <int R>
void rows_against(const float* x, int64_t rows, int64_t in_features, const float* const* w, float* out,
                  int64_t out_stride) {
  int64_t m = 0;
  for (; m + kTileRows <= rows; m += kTileRows) {
    tile<R, kTileRows>(x + m * in_features, in_features, w, out + m * out_stride, out_stride);
  }
  rest_against<R, kTileRows>(x + m * in_features, rows - m, in_features, w, out + m * out_stride, out_stride);
}

}  // namespace

namespace kvasir {

at::Tensor float_linear(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(input.dim() == 2 && weight.dim() == 2 && input.size(1) == weight.size(1),
              "float_linear: input [rows, in] and weight [out, in] must agree, not ", input.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(input.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "float_linear: float32 only");
  const at::Tensor x = input.contiguous(), w = weight.contiguous();
  const int64_t rows = x.size(0), in_features = x.size(1), out_features = w.size(0);
  at::Tensor out = at::empty({rows, out_features}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t groups = (out_features + kRowGroup - 1) / kRowGroup;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, in_features));
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * kRowGroup;
      const float* rows_of_w[kRowGroup];
      for (int64_t r = 0; r < kRowGroup; ++r) rows_of_w[r] = wp + std::min(first + r, out_features - 1) * in_features;
      if (first + kRowGroup <= out_features) {
        rows_against<kRowGroup>(xp, rows, in_features, rows_of_w, op + first, out_features);
      } else {  // the last, short group: one weight row at a time
        for (int64_t r = 0; first + r < out_features; ++r) {
          rows_against<1>(xp, rows, in_features, rows_of_w + r, op + first + r, out_features);
        }
      }
    }
  });
  if (bias.has_value() && bias->defined()) out.add_(*bias);
  return out;
}

}  // namespace kvasir

TORCH_LIBRARY_FRAGMENT(kvasir_kernels, m) {
  m.def("float_linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvasir_kernels, CPU, m) { m.impl("float_linear", kvasir::float_linear); }
