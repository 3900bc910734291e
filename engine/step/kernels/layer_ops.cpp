// The small operations of a llama-family decoder layer, each in one pass over its data, for the CPU step:
// RMSNorm (with the residual add before it), rotary embedding of the queries and keys in place, SiLU-gated
// MLP activation, and attention of one new token per sequence over its blocks in the paged KV cache. In eager
// torch each of these is five to twenty dispatched operations, which cost more than their arithmetic at one
// token per step.
//
// Registered as torch.ops.kvasir_kernels.*; see kernels/__init__.py and step/native_decoder.py.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVASIR_AVX2 1
#endif

namespace {

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.scalar_type() == at::kFloat && t.stride(1) == 1,
              name, " must be a float32 matrix with contiguous rows");
}

// Sum of a[j] * b[j], in eight independent partial sums the compiler can keep in one vector register. b may be
// stored in float16 or bfloat16 (a KV cache's format), read as float32.
template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
  float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int u = 0; u < 8; ++u) partial[u] += a[j + u] * static_cast<float>(b[j + u]);
  }
  float total = 0.f;
  for (; j < n; ++j) total += a[j] * static_cast<float>(b[j]);
  for (int u = 0; u < 8; ++u) total += partial[u];
  return total;
}

void normalize_row(const float* x, const float* weight, float eps, int64_t n, float* out) {
  const float mean_square = dot(x, x, n) / static_cast<float>(n);
  const float inverse = 1.f / std::sqrt(mean_square + eps);
  for (int64_t j = 0; j < n; ++j) out[j] = weight[j] * (x[j] * inverse);
}

#ifdef KVASIR_AVX2
// e^x for eight values at once: x = n ln2 + r, e^r by Cephes' degree-5 polynomial, 2^n through the exponent bits
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-87.3365478515625f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  }
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}
#endif

#ifdef KVASIR_AVX2
// eight stored values as float32
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const at::BFloat16* p) {  // a bfloat16 is the high half of a float32
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// Vector registers the compiler may use: AVX-512VL's 256-bit instructions reach 32, AVX2's 16. Head rows that
// read the same keys or values are computed together where their sums fit in them (kernels below: Heads rows)
#ifdef __AVX512VL__
constexpr int kVectorRegisters = 32;
#else
constexpr int kVectorRegisters = 16;
#endif
constexpr int kMostHeadsAtOnce = 3;  // the instantiated counts: 1 .. 3

// How many head rows a kernel keeping `sums` vectors of sums per head row (and one more each for its query or its
// weight, and one for the vector loaded and one to spare) computes at once
constexpr int heads_at_once(int sums) { return std::min(kMostHeadsAtOnce, (kVectorRegisters - 2) / (sums + 1)); }

// Positions a score kernel takes at once: eight with 32 registers (three head rows' 24 sums), four with 16 (two
// head rows' eight: twice the use of each key vector loaded that eight positions for one head row would give)
constexpr int kScorePositions = kVectorRegisters >= 32 ? 8 : 4;

// out[h][p] = q[h] . (k[p] + offset) * scale for Positions (4 or 8) rows k[p] of `dim` values (a multiple of 8),
// for Heads head rows reading the same keys: each key vector is loaded once for all of them. Each score is the
// same bits whatever Heads and Positions: eight partial sums over the features in order, then added pairwise.
template <int Heads, int Positions, typename T>
inline void score_rows(const float* const* q, const T* const* k, int64_t offset, int64_t dim, float scale,
                       float* const* out) {
  static_assert(Positions == 4 || Positions == 8, "four or eight positions");
  __m256 acc[Heads][Positions];
  for (int h = 0; h < Heads; ++h) {
    for (int p = 0; p < Positions; ++p) acc[h][p] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < dim; j += 8) {
    __m256 qj[Heads];
    for (int h = 0; h < Heads; ++h) qj[h] = _mm256_loadu_ps(q[h] + j);
    for (int p = 0; p < Positions; ++p) {
      const __m256 key = load8(k[p] + offset + j);
      for (int h = 0; h < Heads; ++h) acc[h][p] = _mm256_fmadd_ps(qj[h], key, acc[h][p]);
    }
  }
  for (int h = 0; h < Heads; ++h) {  // pairwise sums: lane p holds acc[h][p]'s low four lanes' sum, lane p + 4 the
    const __m256* a = acc[h];        // high four's (of four positions at a time)
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    if constexpr (Positions == 4) {
      const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(s0123), _mm256_extractf128_ps(s0123, 1));
      _mm_storeu_ps(out[h], _mm_mul_ps(sums, _mm_set1_ps(scale)));
    } else {
      const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
      const __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                                        _mm256_permute2f128_ps(s0123, s4567, 0x31));
      _mm256_storeu_ps(out[h], _mm256_mul_ps(sums, _mm256_set1_ps(scale)));
    }
  }
}
#endif

// row[j] = e^(row[j] - top), returning their sum
float exp_shifted(float* row, int64_t n, float top) {
  int64_t j = 0;
  float total = 0.f;
#ifdef KVASIR_AVX2
  __m256 sums = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), _mm256_set1_ps(top)));
    _mm256_storeu_ps(row + j, e);
    sums = _mm256_add_ps(sums, e);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, sums);
  for (const float lane : lanes) total += lane;
#endif
  for (; j < n; ++j) total += (row[j] = std::exp(row[j] - top));
  return total;
}

// row[0 .. n) = softmax(row[0 .. n)), in place
void softmax_in_place(float* row, int64_t n) {
  const float inverse = 1.f / exp_shifted(row, n, *std::max_element(row, row + n));
  for (int64_t pos = 0; pos < n; ++pos) row[pos] *= inverse;
}

#ifdef KVASIR_AVX2
inline void prefetch(const void* start, int64_t bytes) {
  const char* first = reinterpret_cast<const char*>(start);
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(first + line, _MM_HINT_T0);
}

// out[h][0 .. 8 * Vectors) += p[h][pos] * (values[pos] + offset)[0 .. 8 * Vectors) for positions [from, to) in
// order, for Heads head rows reading the same values (one kv head's): each position's loads serve all of them,
// and each row's sums are the ones it would get alone. out taken as zeros where `from` is 0 (a row's positions in
// tiles give the sums one pass over them gives)
template <int Heads, int Vectors, typename T>
inline void accumulate_values(const float* const* p, const T* const* values, int64_t from, int64_t to,
                              int64_t offset, float* const* out) {
  __m256 acc[Heads][Vectors];
  for (int h = 0; h < Heads; ++h) {
    for (int u = 0; u < Vectors; ++u) acc[h][u] = from == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out[h] + 8 * u);
  }
  for (int64_t pos = from; pos < to; ++pos) {
    __m256 weight[Heads];
    for (int h = 0; h < Heads; ++h) weight[h] = _mm256_set1_ps(p[h][pos]);
    const T* v = values[pos] + offset;
    if (pos + 8 < to) prefetch(values[pos + 8] + offset, 8 * Vectors * sizeof(T));
    for (int u = 0; u < Vectors; ++u) {
      const __m256 x = load8(v + 8 * u);
      for (int h = 0; h < Heads; ++h) acc[h][u] = _mm256_fmadd_ps(weight[h], x, acc[h][u]);
    }
  }
  for (int h = 0; h < Heads; ++h) {
    for (int u = 0; u < Vectors; ++u) _mm256_storeu_ps(out[h] + 8 * u, acc[h][u]);
  }
}

// Features of a head row's output a value kernel sums at once, in eight-lane vectors: 64 with 32 registers (three
// head rows' 24 sums), 32 with 16 (two head rows' eight: twice the use of each value vector loaded that 64
// features of one head row would give)
constexpr int kValueVectors = kVectorRegisters >= 32 ? 8 : 4;

// Calls kernel(std::integral_constant<int, n>) for n = `heads` (1 .. Most): a run-time count of head rows to a
// kernel's compile-time one
template <int Most, typename Kernel>
inline void with_heads(int64_t heads, Kernel&& kernel) {
  if constexpr (Most >= 3) {
    if (heads == 3) return kernel(std::integral_constant<int, 3>{});
  }
  if constexpr (Most >= 2) {
    if (heads == 2) return kernel(std::integral_constant<int, 2>{});
  }
  kernel(std::integral_constant<int, 1>{});
}

// How many of head rows r, r + 1, ... (at most `most`, and none from `heads` on) read head row r's kv head (head
// rows cycle through `rows` query heads, `group` of them per kv head)
inline int64_t sharing_kv_head(int64_t r, int64_t rows, int64_t group, int64_t heads, int64_t most) {
  return std::min({most, group - r % rows % group, heads - r});
}
#endif

// Softmax(q . k * scale) v for one sequence's query heads of kv heads [first, last): each cached position's
// keys and values for those heads are one contiguous run, read once for all their query heads. T: how the cache
// stores them (float32, float16 or bfloat16; q8_0 is read into float32 first).
template <typename T>
struct PagedKV {
  const T *keys, *values;
  int64_t num_blocks, block_size, kv_heads, dim;
  // where each of positions [0, length) keeps its values for kv heads first.. in `cache` (keys or values), a block
  // at a time: out[pos]
  void rows(const T* cache, const int64_t* table, int64_t length, int64_t first, std::vector<const T*>& out) const {
    out.resize(static_cast<size_t>(length));
    for (int64_t start = 0; start < length; start += block_size) {
      const int64_t block = table[start / block_size];
      TORCH_CHECK(block >= 0 && block < num_blocks, "block id out of the cache");
      const T* base = cache + (block * block_size * kv_heads + first) * dim;
      for (int64_t i = 0; i < std::min(block_size, length - start); ++i) out[start + i] = base + i * kv_heads * dim;
    }
  }
};

// -- the cache's stored formats (engine/serving/kv_format.py): the same bytes as its torch writes ---------------

constexpr int64_t kQ8Group = 32;

enum class Stored { kFloat, kBFloat16, kHalf, kQ8_0 };

Stored stored_format(const at::Tensor& cache, const at::Tensor& scales) {
  switch (cache.scalar_type()) {
    case at::kFloat: return Stored::kFloat;
    case at::kBFloat16: return Stored::kBFloat16;
    case at::kHalf: return Stored::kHalf;
    case at::kChar:
      TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.numel() * kQ8Group == cache.numel(),
                  "a q8_0 cache needs one float16 scale per 32 values");
      return Stored::kQ8_0;
    default: TORCH_CHECK(false, "the KV cache must be float32, bfloat16, float16 or q8_0 (int8 with scales)");
  }
}

// out[0 .. count) = a q8_0 cache's values from element `offset` on, as float32 (the 16- and 32-bit formats are
// read in place: PagedKV<T>)
void load_q8_0(const int8_t* data, const at::Half* scales, int64_t offset, int64_t count, float* out) {
  const int8_t* in = data + offset;
  const at::Half* scale = scales + offset / kQ8Group;
  for (int64_t g = 0; g < count / kQ8Group; ++g) {
    const float d = static_cast<float>(scale[g]);
    int64_t j = g * kQ8Group;
#ifdef KVASIR_AVX2
    const __m256 step = _mm256_set1_ps(d);
    for (; j < (g + 1) * kQ8Group; j += 8) {
      const __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + j)));
      _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(wide), step));
    }
#endif
    for (; j < (g + 1) * kQ8Group; ++j) out[j] = static_cast<float>(in[j]) * d;
  }
}

// The q8_0 rule of kv_format.quantize_q8_0: d = max|x| / 127, q = round-half-even(x / d) through 1 / d
void store_q8_0(const float* values, int64_t count, int8_t* quants, at::Half* scales) {
  for (int64_t g = 0; g < count / kQ8Group; ++g) {
    const float* x = values + g * kQ8Group;
    float top = 0.f;
    for (int64_t j = 0; j < kQ8Group; ++j) top = std::max(top, std::fabs(x[j]));
    const float d = top / 127.f, inverse = d > 0.f ? 1.f / d : 0.f;
    for (int64_t j = 0; j < kQ8Group; ++j) {
      const float q = std::nearbyint(x[j] * inverse);  // NaN for 0 * inf in a group below 1 / FLT_MAX: stored 0
      quants[g * kQ8Group + j] = std::isnan(q) ? 0 : static_cast<int8_t>(std::min(127.f, std::max(-127.f, q)));
    }
    scales[g] = at::Half(d);
  }
}

// A cache stored as T, read where it lies
template <typename T>
PagedKV<T> in_place(const at::Tensor& keys, const at::Tensor& values) {
  return {keys.data_ptr<T>(), values.data_ptr<T>(), keys.size(0), keys.size(1), keys.size(2), keys.size(3)};
}

// The query rows of one step that attend over one sequence: `count` consecutive rows whose lengths are `length`,
// `length` + 1, ... (a plain decode row is a run of one; a drafted run checked in one step is its last token and
// each draft). Each row's heads for kv heads [first, last) sit at q + i * q_stride (output at o + i * o_stride).
struct QueryRun {
  const float* q;
  int64_t q_stride;
  float* o;
  int64_t o_stride, length, count;
  int64_t length_of(int64_t i) const { return length + i; }
};

// A run's head rows: head row r is query head r % rows of row r / rows (`rows` query heads a row), with its query,
// its scores over positions [0, longest) in `score_buffer`, and its output
struct HeadRows {
  std::vector<const float*> q;
  std::vector<float*> scores, o;
  void point(const QueryRun& run, int64_t rows, int64_t dim, float* score_buffer, int64_t longest) {
    const auto heads = static_cast<size_t>(run.count * rows);
    q.resize(heads);
    scores.resize(heads);
    o.resize(heads);
    for (int64_t r = 0; r < run.count * rows; ++r) {
      q[r] = run.q + r / rows * run.q_stride + r % rows * dim;
      o[r] = run.o + r / rows * run.o_stride + r % rows * dim;
      scores[r] = score_buffer + r * longest;
    }
  }
};

// scores[r][pos] = q_r . k[pos] * scale for positions [from, to) and head rows r = 0 .. heads, row r reading its
// kv head's keys (head rows cycle through `rows` query heads, `group` of them per kv head). Eight positions at a
// time while eight remain before `to`, then one by one: the arithmetic one row alone would get.
template <typename T>
void score_positions(const T* const* keys, int64_t dim, int64_t from, int64_t to, const float* const* q,
                     float* const* scores, int64_t heads, int64_t rows, int64_t group, float scale) {
  int64_t pos = from;
#ifdef KVASIR_AVX2
  if (dim % 8 == 0) {  // eight positions at a time: their dot products leave as one vector of scores
    const int64_t row_bytes = rows / group * dim * static_cast<int64_t>(sizeof(T));  // these kv heads' keys
    for (; pos + 8 <= to; pos += 8) {
      const T* const* k = keys + pos;
      // the cache is read once and from memory: ask for the keys two rounds ahead while these are multiplied
      for (int64_t ahead = pos + 16; ahead < std::min(pos + 24, to); ++ahead) prefetch(keys[ahead], row_bytes);
      for (int64_t r = 0; r < heads;) {  // the head rows of one kv head a few at a time
        constexpr int kMost = heads_at_once(kScorePositions);
        const int64_t n = sharing_kv_head(r, rows, group, heads, kMost), offset = (r % rows / group) * dim;
        with_heads<kMost>(n, [&](auto heads_now) {
          constexpr int Heads = decltype(heads_now)::value;
          float* out[Heads];
          for (int64_t part = 0; part < 8; part += kScorePositions) {
            for (int h = 0; h < Heads; ++h) out[h] = scores[r + h] + pos + part;
            score_rows<Heads, kScorePositions>(q + r, k + part, offset, dim, scale, out);
          }
        });
        r += n;
      }
    }
  }
#endif
  for (; pos < to; ++pos) {
    const T* k = keys[pos];
    for (int64_t r = 0; r < heads; ++r) scores[r][pos] = dot(q[r], k + (r % rows / group) * dim, dim) * scale;
  }
}

// Softmax(q . k * scale) v for a run of query rows (QueryRun) and their query heads of kv heads [first, last):
// each cached position's keys and values for those heads are one contiguous run, read from memory once for all
// the rows and heads. Every row's result is bit for bit what it would be attended alone. T: how the cache stores
// them (float32, float16 or bfloat16; q8_0 is read into float32 first).
template <typename T>
void attend_sequence(const PagedKV<T>& kv, const int64_t* table, const QueryRun& run, int64_t first, int64_t last,
                     int64_t group, float scale, std::vector<float>& scores) {
  const int64_t rows = (last - first) * group, dim = kv.dim;  // query heads per row
  const int64_t heads = run.count * rows, longest = run.length_of(run.count - 1);
  scores.resize(static_cast<size_t>(heads * longest));
  thread_local HeadRows head_rows;
  head_rows.point(run, rows, dim, scores.data(), longest);
  const std::vector<const float*>& q = head_rows.q;
  const std::vector<float*>& score_rows = head_rows.scores;
  const std::vector<float*>& o = head_rows.o;
  auto length_of = [&](int64_t r) { return run.length_of(r / rows); };
  // the positions every row scores eight at a time, for all rows at once; then each row's own last few
  int64_t shared = 0;
#ifdef KVASIR_AVX2
  if (dim % 8 == 0) shared = run.length / 8 * 8;
#endif
  thread_local std::vector<const T*> keys, values;
  kv.rows(kv.keys, table, longest, first, keys);
  kv.rows(kv.values, table, longest, first, values);
  score_positions(keys.data(), dim, 0, shared, q.data(), score_rows.data(), heads, rows, group, scale);
  for (int64_t i = 0; i < run.count; ++i) {
    score_positions(keys.data(), dim, shared, run.length_of(i), q.data() + i * rows, score_rows.data() + i * rows,
                    rows, rows, group, scale);
  }
  for (int64_t r = 0; r < heads; ++r) softmax_in_place(score_rows[r], length_of(r));
  int64_t done = 0;  // features of every head already written
#ifdef KVASIR_AVX2
  if (dim % 8 == 0) {
    for (int64_t pos = 0; pos < std::min<int64_t>(8, longest); ++pos) {
      prefetch(values[pos], (last - first) * dim * static_cast<int64_t>(sizeof(T)));
    }
    // a tile of positions at a time, whose values stay in the core's caches while every head of every row adds
    // them in: 64 (or 32) features of one head's output in registers over the tile, for as many of a row's heads
    // of one kv head as the registers hold
    constexpr int64_t kTile = 128;
    for (int64_t tile = 0; tile < longest; tile += kTile) {
      for (int64_t r = 0; r < heads;) {  // a row's head rows of one kv head a few at a time: the same length
        constexpr int kMost = heads_at_once(kValueVectors), kWidth = 8 * kValueVectors;
        const int64_t n = sharing_kv_head(r, rows, group, heads, kMost);
        const int64_t end = std::min(tile + kTile, length_of(r)), offset = (r % rows / group) * dim;
        if (tile < end) {
          with_heads<kMost>(n, [&](auto heads_now) {
            constexpr int Heads = decltype(heads_now)::value;
            float* out[Heads];
            for (int64_t j0 = 0; j0 + kWidth <= dim; j0 += kWidth) {
              for (int h = 0; h < Heads; ++h) out[h] = o[r + h] + j0;
              accumulate_values<Heads, kValueVectors>(score_rows.data() + r, values.data(), tile, end, offset + j0,
                                                      out);
            }
            for (int64_t j0 = dim / kWidth * kWidth; j0 < dim; j0 += 8) {
              for (int h = 0; h < Heads; ++h) out[h] = o[r + h] + j0;
              accumulate_values<Heads, 1>(score_rows.data() + r, values.data(), tile, end, offset + j0, out);
            }
          });
        }
        r += n;
      }
    }
    done = dim;
  }
#endif
  for (int64_t r = 0; r < heads; ++r) std::fill(o[r] + done, o[r] + dim, 0.f);
  for (int64_t pos = 0; pos < longest && done < dim; ++pos) {
    const T* v = values[pos];
    for (int64_t r = 0; r < heads; ++r) {
      if (pos >= length_of(r)) continue;
      const float p = score_rows[r][pos];
      const T* vh = v + (r % rows / group) * dim;
      for (int64_t j = done; j < dim; ++j) o[r][j] += p * static_cast<float>(vh[j]);
    }
  }
}

#ifdef KVASIR_AVX2
constexpr int64_t kScoreShare = 256;  // positions per thread's share of the scores (a multiple of eight)
constexpr int64_t kFeatureShare = 32;  // features of one kv head per thread's share of the values
// the context from which a lone row is shared out so (below it the three parallel sections cost more than the
// imbalance: 300 positions of the default model took 15 us a layer against 12; 3,700 took 94 against 111)
constexpr int64_t kShareFrom = 1024;

// attend_sequence for a lone query row over every kv head (a single chat's decode step, a draft model's pass),
// shared among the threads by positions (the scores), query heads (the softmax) and 32-feature slices of each kv
// head (the values) instead of by kv heads: three kv heads on two threads kept one thread idle a third of the
// time. Every value is computed as attend_sequence computes it and summed in the same order (whole eights of
// positions through score_rows, the same exponentials, each feature's sum over positions in order), so the row's result
// is the same bits. (A drafted run's rows shared so moved their scores' buffer between the threads, which cost
// more than the balance gave: 0.97x on a single chat's checks at 3,600 tokens. They keep attend_sequence.) Needs a
// head size that is a multiple of 32.
template <typename T>
void attend_row_shared(const PagedKV<T>& kv, const int64_t* table, const QueryRun& row, int64_t group, float scale) {
  const int64_t dim = kv.dim, heads = kv.kv_heads * group, length = row.length, shared = length / 8 * 8;
  // the calling thread's buffers, reached from the others through these pointers (a lambda that named a
  // thread_local would reach its own thread's)
  thread_local std::vector<float> score_buffer;
  thread_local HeadRows head_rows;
  thread_local std::vector<const T*> key_rows, value_rows;
  score_buffer.resize(static_cast<size_t>(heads * length));
  head_rows.point(row, heads, dim, score_buffer.data(), length);
  kv.rows(kv.keys, table, length, 0, key_rows);
  kv.rows(kv.values, table, length, 0, value_rows);
  const float* const* q = head_rows.q.data();
  float* const* scores = head_rows.scores.data();
  float* const* o = head_rows.o.data();
  const T* const* keys = key_rows.data();
  const T* const* values = value_rows.data();
  at::parallel_for(0, (shared + kScoreShare - 1) / kScoreShare, 1, [&](int64_t begin, int64_t end) {
    score_positions(keys, dim, begin * kScoreShare, std::min(end * kScoreShare, shared), q, scores, heads, heads,
                    group, scale);
  });
  score_positions(keys, dim, shared, length, q, scores, heads, heads, group, scale);  // the last few positions
  at::parallel_for(0, heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) softmax_in_place(scores[r], length);
  });
  const int64_t slices = dim / kFeatureShare;
  at::parallel_for(0, kv.kv_heads * slices, 1, [&](int64_t begin, int64_t end) {
    constexpr int64_t kTile = 128;  // as attend_sequence: a tile's values stay in the caches for every head
    for (int64_t share = begin; share < end; ++share) {
      const int64_t head = share / slices, feature = share % slices * kFeatureShare, offset = head * dim + feature;
      const int64_t first = head * group, last = first + group;  // this kv head's query heads
      for (int64_t tile = 0; tile < length; tile += kTile) {
        const int64_t end_pos = std::min(tile + kTile, length);
        constexpr int kVectors = kFeatureShare / 8;
        for (int64_t r = first; r < last;) {  // query heads a few at a time over the same values
          const int64_t n = sharing_kv_head(r, heads, group, last, heads_at_once(kVectors));
          with_heads<heads_at_once(kVectors)>(n, [&](auto heads_now) {
            constexpr int Heads = decltype(heads_now)::value;
            float* out[Heads];
            for (int h = 0; h < Heads; ++h) out[h] = o[r + h] + feature;
            accumulate_values<Heads, kVectors>(scores + r, values, tile, end_pos, offset, out);
          });
          r += n;
        }
      }
    }
  });
}
#endif

// A share of one step's attention for one thread: rows [row, row + count) of one run, kv heads [first, last)
struct AttentionTask {
  int64_t row, count, first, last;
};

// Rows that continue one another (a drafted run checked in one step: one block table, lengths one apart) are one
// run, attended together so that each cached position is read once for all of them. A task per run where there
// are enough of them to keep every thread busy, else per run and kv head, and a long run's rows in pieces too.
// How rows and heads are shared out never changes a row's arithmetic.
std::vector<AttentionTask> plan_tasks(const int64_t* tables, const int64_t* lens, int64_t batch, int64_t width,
                                      int64_t kv_heads, int64_t threads) {
  std::vector<int64_t> starts{0};
  for (int64_t b = 1; b < batch; ++b) {
    const int64_t* before = tables + (b - 1) * width;
    if (lens[b] != lens[b - 1] + 1 || !std::equal(before, before + width, tables + b * width)) starts.push_back(b);
  }
  starts.push_back(batch);
  const int64_t runs = static_cast<int64_t>(starts.size()) - 1, wanted = 2 * threads;
  const int64_t splits = runs >= wanted ? 1 : kv_heads;
  const int64_t pieces = std::max<int64_t>(1, (wanted + runs * splits - 1) / (runs * splits));
  std::vector<AttentionTask> tasks;
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t count = starts[r + 1] - starts[r], parts = std::min(pieces, count);
    for (int64_t part = 0; part < parts; ++part) {
      const int64_t row = starts[r] + part * count / parts, rows = starts[r] + (part + 1) * count / parts - row;
      for (int64_t head = 0; head < splits; ++head) {
        tasks.push_back({row, rows, head * kv_heads / splits, (head + 1) * kv_heads / splits});
      }
    }
  }
  return tasks;
}

}  // namespace

namespace kvasir {

// weight * x / sqrt(mean(x^2) + eps), row by row
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(weight.is_contiguous() && weight.scalar_type() == at::kFloat && weight.numel() == x.size(1),
              "weight must be float32 with one value per feature");
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({rows, n}, x.options());
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      normalize_row(x.data_ptr<float>() + r * x.stride(0), weight.data_ptr<float>(), static_cast<float>(eps), n,
                    out.data_ptr<float>() + r * n);
    }
  });
  return out;
}

// residual += x, then the RMSNorm of the new residual
at::Tensor add_rms_norm_(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(residual.is_contiguous() && residual.sizes() == x.sizes(), "residual must match x and be contiguous");
  float* res = residual.data_ptr<float>();
  const int64_t rows = x.size(0), n = x.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* add = x.data_ptr<float>() + r * x.stride(0);
    for (int64_t j = 0; j < n; ++j) res[r * n + j] += add[j];
  }
  return rms_norm(residual, weight, eps);
}

// Rotary embedding in place on the query and key heads of a fused QKV projection [T, (H + 2 KH) * D]
// (queries, then keys, then values): x * cos + rotate_half(x) * sin, as transformers computes it.
void rotary_qk_(at::Tensor& qkv, int64_t heads, int64_t kv_heads, const at::Tensor& cos, const at::Tensor& sin) {
  check_rows(qkv, "qkv");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 && cos.sizes() == sin.sizes() &&
                  cos.size(0) == qkv.size(0), "cos and sin must be contiguous [T, head_dim]");
  const int64_t dim = cos.size(1), half = dim / 2;
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * dim, "qkv does not hold heads + 2 kv_heads of head_dim");
  const int64_t rotated_heads = heads + kv_heads;
  at::parallel_for(0, qkv.size(0), 16, [&](int64_t begin, int64_t end) {
    std::vector<float> low(half);
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos.data_ptr<float>() + t * dim;
      const float* s = sin.data_ptr<float>() + t * dim;
      float* row = qkv.data_ptr<float>() + t * qkv.stride(0);
      for (int64_t h = 0; h < rotated_heads; ++h) {
        float* x = row + h * dim;
        for (int64_t j = 0; j < half; ++j) low[j] = x[j];
        for (int64_t j = 0; j < half; ++j) x[j] = x[j] * c[j] - x[j + half] * s[j];
        for (int64_t j = 0; j < half; ++j) x[j + half] = x[j + half] * c[j + half] + low[j] * s[j + half];
      }
    }
  });
}

// silu(gate) * up for gate_up = [T, 2 I] (gate first)
at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up");
  const int64_t rows = gate_up.size(0), n = gate_up.size(1) / 2;
  at::Tensor out = at::empty({rows, n}, gate_up.options());
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = gate_up.data_ptr<float>() + r * gate_up.stride(0);
      const float* up = gate + n;
      float* o = out.data_ptr<float>() + r * n;
      int64_t j = 0;
#ifdef KVASIR_AVX2
      const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
      for (; j + 8 <= n; j += 8) {
        const __m256 g = _mm256_loadu_ps(gate + j);
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g))));
        _mm256_storeu_ps(o + j, _mm256_mul_ps(silu, _mm256_loadu_ps(up + j)));
      }
#endif
      for (; j < n; ++j) o[j] = gate[j] / (1.f + std::exp(-gate[j])) * up[j];
    }
  });
  return out;
}

// `count` values into a cache of any stored format from element `offset` on
void store_kv(const float* values, int64_t count, at::Tensor& cache, at::Tensor& scales, int64_t offset) {
  switch (stored_format(cache, scales)) {
    case Stored::kFloat:
      std::copy_n(values, count, cache.data_ptr<float>() + offset);
      return;
    case Stored::kBFloat16: {
      at::BFloat16* out = cache.data_ptr<at::BFloat16>() + offset;
      for (int64_t j = 0; j < count; ++j) out[j] = at::BFloat16(values[j]);
      return;
    }
    case Stored::kHalf: {
      at::Half* out = cache.data_ptr<at::Half>() + offset;
      for (int64_t j = 0; j < count; ++j) out[j] = at::Half(values[j]);
      return;
    }
    case Stored::kQ8_0:
      TORCH_CHECK(offset % kQ8Group == 0 && count % kQ8Group == 0, "q8_0 is written in whole groups of 32");
      store_q8_0(values, count, cache.data_ptr<int8_t>() + offset, scales.data_ptr<at::Half>() + offset / kQ8Group);
      return;
  }
}

// One query token per row, attended over its sequence's first `lengths[b]` cached positions. query: [B, H * D]
// (rows may be strided), caches: [blocks, block_size, KH, D], block_tables: [B, W] int64. A sequence has one row
// in a plain decode step and several in a step that checks drafted tokens: its last token's and each draft's,
// one position longer each.
//
// float32, float16 and bfloat16 caches are read in place, each value converted as it is loaded (at long contexts
// a decode step is as fast as the cache's bytes are read, so a 16-bit cache is the faster one). A q8_0 cache:
// per task, the sequence's keys and values for its kv heads are first read into float32 rows of one contiguous
// block, then attended as a float32 cache is. That block is the sequence's length x its kv heads' width: 1.5 MiB
// for 2,048 tokens of the default model's three heads, but 128 MiB at 32K tokens of eight 128-wide heads (a tiled
// version would bound it; not needed for the models here).
at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  const at::Tensor& key_scales, const at::Tensor& value_scales,
                                  const at::Tensor& block_tables, const at::Tensor& lengths, int64_t heads,
                                  double scale) {
  check_rows(query, "query");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() && key_cache.dim() == 4 &&
                  key_cache.sizes() == value_cache.sizes() && key_cache.scalar_type() == value_cache.scalar_type(),
              "caches must be contiguous [blocks, block_size, kv_heads, head_dim] of one type");
  const Stored format = stored_format(key_cache, key_scales);
  TORCH_CHECK(stored_format(value_cache, value_scales) == format, "keys and values must be stored alike");
  TORCH_CHECK(format != Stored::kQ8_0 || (key_scales.is_contiguous() && value_scales.is_contiguous() &&
                                          key_cache.size(3) % kQ8Group == 0),
              "q8_0 caches need contiguous scales and a head size that is a multiple of 32");
  TORCH_CHECK(block_tables.is_contiguous() && block_tables.scalar_type() == at::kLong && block_tables.dim() == 2 &&
                  lengths.is_contiguous() && lengths.scalar_type() == at::kLong &&
                  lengths.numel() == query.size(0) && block_tables.size(0) == query.size(0),
              "block_tables [B, W] and lengths [B] must be contiguous int64");
  const int64_t batch = query.size(0), block_size = key_cache.size(1), kv_heads = key_cache.size(2);
  const int64_t dim = key_cache.size(3), group = heads / kv_heads, width = block_tables.size(1);
  TORCH_CHECK(heads % kv_heads == 0 && query.size(1) == heads * dim, "query does not hold heads * head_dim");
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= width * block_size, "sequence length out of its block table");
  }
  at::Tensor out = at::empty({batch, heads * dim}, query.options());
#ifdef KVASIR_AVX2
  if (format != Stored::kQ8_0 && batch == 1 && lens[0] >= kShareFrom && dim % kFeatureShare == 0 &&
      at::get_num_threads() > 1) {
    const QueryRun row{query.data_ptr<float>(), query.stride(0), out.data_ptr<float>(), heads * dim, lens[0], 1};
    const float s = static_cast<float>(scale);
    switch (format) {
      case Stored::kFloat: attend_row_shared(in_place<float>(key_cache, value_cache), tables, row, group, s); break;
      case Stored::kHalf: attend_row_shared(in_place<at::Half>(key_cache, value_cache), tables, row, group, s); break;
      case Stored::kBFloat16:
        attend_row_shared(in_place<at::BFloat16>(key_cache, value_cache), tables, row, group, s);
        break;
      case Stored::kQ8_0: break;
    }
    return out;
  }
#endif
  const std::vector<AttentionTask> tasks = plan_tasks(tables, lens, batch, width, kv_heads, at::get_num_threads());
  const int64_t num_blocks = key_cache.size(0);
  const at::Half* key_scale = format == Stored::kQ8_0 ? key_scales.data_ptr<at::Half>() : nullptr;
  const at::Half* value_scale = format == Stored::kQ8_0 ? value_scales.data_ptr<at::Half>() : nullptr;
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    // each thread's buffers outlive the call: a long sequence's keys and values in float32 are megabytes, which a
    // fresh vector would map, fault in page by page and zero in every layer of every step
    thread_local std::vector<float> scores, keys, values;
    const int64_t zero_block = 0;
    for (int64_t t = begin; t < end; ++t) {
      const AttentionTask& task = tasks[t];
      const int64_t b = task.row, first = task.first, last = task.last;
      const QueryRun run{query.data_ptr<float>() + b * query.stride(0) + first * group * dim, query.stride(0),
                         out.data_ptr<float>() + b * heads * dim + first * group * dim, heads * dim, lens[b],
                         task.count};
      const int64_t* table = tables + b * width;
      const float s = static_cast<float>(scale);
      switch (format) {
        case Stored::kFloat:
          attend_sequence(in_place<float>(key_cache, value_cache), table, run, first, last, group, s, scores);
          continue;
        case Stored::kHalf:
          attend_sequence(in_place<at::Half>(key_cache, value_cache), table, run, first, last, group, s, scores);
          continue;
        case Stored::kBFloat16:
          attend_sequence(in_place<at::BFloat16>(key_cache, value_cache), table, run, first, last, group, s, scores);
          continue;
        case Stored::kQ8_0: break;
      }
      const int64_t width_read = (last - first) * dim, longest = run.length_of(run.count - 1);
      keys.resize(static_cast<size_t>(longest * width_read));
      values.resize(static_cast<size_t>(longest * width_read));
      for (int64_t pos = 0; pos < longest; ++pos) {
        const int64_t block = table[pos / block_size];
        TORCH_CHECK(block >= 0 && block < num_blocks, "block id out of the cache");
        const int64_t offset = ((block * block_size + pos % block_size) * kv_heads + first) * dim;
        load_q8_0(key_cache.data_ptr<int8_t>(), key_scale, offset, width_read, keys.data() + pos * width_read);
        load_q8_0(value_cache.data_ptr<int8_t>(), value_scale, offset, width_read, values.data() + pos * width_read);
      }
      const PagedKV<float> loaded{keys.data(), values.data(), 1, longest, last - first, dim};
      attend_sequence(loaded, &zero_block, run, 0, last - first, group, s, scores);
    }
  });
  return out;
}

}  // namespace kvasir

TORCH_LIBRARY_FRAGMENT(kvasir_kernels, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm_(Tensor(a!) residual, Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rotary_qk_(Tensor(a!) qkv, int heads, int kv_heads, Tensor cos, Tensor sin) -> ()");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("paged_decode_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor key_scales, "
        "Tensor value_scales, Tensor block_tables, Tensor lengths, int heads, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvasir_kernels, CPU, m) {
  m.impl("rms_norm", kvasir::rms_norm);
  m.impl("add_rms_norm_", kvasir::add_rms_norm_);
  m.impl("rotary_qk_", kvasir::rotary_qk_);
  m.impl("silu_mul", kvasir::silu_mul);
  m.impl("paged_decode_attention", kvasir::paged_decode_attention);
}
