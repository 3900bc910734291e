// Every decoder layer of a decode step (one new token per sequence) in one call: at a handful of tokens per
// step the work per operation is small, and calling the layer operations from C++ instead of Python removes
// about 300 dispatches a step. The layer is the llama family's, as NativeDecoder runs it operation by operation.
//
// Registered as torch.ops.kvasir_kernels.decode_layers_; see step/native_decoder.py.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "kernels.h"

namespace {

constexpr int64_t kWeightsPerLayer = 10;  // see decode_layers_
constexpr int64_t kMatricesPerLayer = 4;  // qkv, o, gate_up, down
// The block kinds (native_decoder._KIND_CODES): their bytes per 32 weights and their linear operation
struct BlockKind {
  int64_t bytes;
  at::Tensor (*linear)(const at::Tensor&, const at::Tensor&, int64_t, int64_t);
};
const BlockKind kKinds[] = {{20, kvasir::q4_1_linear}, {34, kvasir::q8_0_linear}, {24, kvasir::q4_1f_linear}};

// Every matrix of the one-call step has whole groups of eight rows (NativeDecoder checks), so the group count
// gives the output width.
// With `fine`, each row's 8-bit remainder (kvasir::activation_remainder) goes through as a second row and the two
// outputs are added: the activations' rounding is then that of about 15 bits.
at::Tensor linear(const at::Tensor& x, const at::Tensor& groups, int64_t kind, const at::Tensor& bias, bool fine) {
  TORCH_CHECK(kind >= 0 && kind < 3, "unknown block kind ", kind);
  const BlockKind& block = kKinds[kind];
  const int64_t in_features = groups.size(1) / (8 * block.bytes) * 32, out_features = groups.size(0) * 8;
  at::Tensor out;
  if (fine) {
    const int64_t rows = x.size(0);
    const at::Tensor both = block.linear(at::cat({x, kvasir::activation_remainder(x)}), groups, in_features,
                                         out_features);
    out = both.narrow(0, 0, rows) + both.narrow(0, rows, rows);
  } else {
    out = block.linear(x, groups, in_features, out_features);
  }
  if (bias.numel() > 0) out.add_(bias);
  return out;
}

// The new keys and values of each token into its cache slot (rows of [tokens, (H + 2 KH) * D] after the queries),
// in the cache's stored format.
void write_cache(const at::Tensor& qkv, const at::Tensor& slot_mapping, int64_t queries, int64_t width,
                 at::Tensor& key_cache, at::Tensor& value_cache, at::Tensor& key_scales, at::Tensor& value_scales) {
  const int64_t slots = key_cache.numel() / width;
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < qkv.size(0); ++t) {
    TORCH_CHECK(slot[t] >= 0 && slot[t] < slots, "cache slot out of range");
    const float* row = qkv.data_ptr<float>() + t * qkv.stride(0) + queries;
    kvasir::store_kv(row, width, key_cache, key_scales, slot[t] * width);
    kvasir::store_kv(row + width, width, value_cache, value_scales, slot[t] * width);
  }
}

at::Tensor scales_of(at::TensorList scales, int64_t layer) {
  return scales.empty() ? at::Tensor(at::empty({0}, at::kHalf)) : scales[layer];
}

}  // namespace

namespace kvasir {

// weights: per layer input_norm, qkv_blocks, qkv_bias, o_blocks, o_bias, post_norm, gate_up_blocks, gate_up_bias,
// down_blocks, down_bias (an empty tensor where there is no bias); kinds: per layer the block kind of qkv, o,
// gate_up and down (0: Q4_1, 1: Q8_0, 2: Q4_1 with float32 scales). residual [T, hidden] is updated in place:
// it leaves as the last layer's output, before the final norm.
// key_scales / value_scales: per layer the q8_0 caches' scales, empty lists for the float caches. fine: the
// activations go through as 8-bit codes and their 8-bit remainder (see linear).
void decode_layers_(at::Tensor& residual, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slot_mapping,
                    const at::Tensor& block_tables, const at::Tensor& lengths, at::TensorList key_caches,
                    at::TensorList value_caches, at::TensorList key_scales, at::TensorList value_scales,
                    at::TensorList weights, at::IntArrayRef kinds, int64_t heads, int64_t kv_heads, double eps,
                    double scale, bool fine) {
  const int64_t layers = static_cast<int64_t>(key_caches.size());
  TORCH_CHECK(residual.is_contiguous() && residual.scalar_type() == at::kFloat && residual.dim() == 2,
              "residual must be a contiguous float32 [tokens, hidden] tensor");
  TORCH_CHECK(static_cast<int64_t>(value_caches.size()) == layers &&
                  static_cast<int64_t>(weights.size()) == layers * kWeightsPerLayer &&
                  static_cast<int64_t>(kinds.size()) == layers * kMatricesPerLayer,
              "one cache pair, ", kWeightsPerLayer, " weights and ", kMatricesPerLayer, " kinds per layer");
  TORCH_CHECK(key_scales.size() == value_scales.size() &&
                  (key_scales.empty() || static_cast<int64_t>(key_scales.size()) == layers),
              "scales for every layer's keys and values, or for none");
  TORCH_CHECK(slot_mapping.is_contiguous() && slot_mapping.scalar_type() == at::kLong &&
                  slot_mapping.numel() == residual.size(0), "slot_mapping must be int64 [tokens]");
  const int64_t dim = cos.size(1), queries = heads * dim, kv_width = kv_heads * dim;
  at::Tensor normed = rms_norm(residual, weights[0], eps);
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* w = weights.data() + l * kWeightsPerLayer;
    const int64_t* kind = kinds.data() + l * kMatricesPerLayer;
    at::Tensor qkv = linear(normed, w[1], kind[0], w[2], fine);
    rotary_qk_(qkv, heads, kv_heads, cos, sin);
    at::Tensor key_cache = key_caches[l], value_cache = value_caches[l];
    at::Tensor key_scale = scales_of(key_scales, l), value_scale = scales_of(value_scales, l);
    write_cache(qkv, slot_mapping, queries, kv_width, key_cache, value_cache, key_scale, value_scale);
    at::Tensor attended = paged_decode_attention(qkv.narrow(1, 0, queries), key_cache, value_cache, key_scale,
                                                 value_scale, block_tables, lengths, heads, scale);
    normed = add_rms_norm_(residual, linear(attended, w[3], kind[1], w[4], fine), w[5], eps);
    at::Tensor mlp = linear(silu_mul(linear(normed, w[6], kind[2], w[7], fine)), w[8], kind[3], w[9], fine);
    if (l + 1 < layers) {
      normed = add_rms_norm_(residual, mlp, weights[(l + 1) * kWeightsPerLayer], eps);
    } else {
      residual.add_(mlp);
    }
  }
}

}  // namespace kvasir

TORCH_LIBRARY_FRAGMENT(kvasir_kernels, m) {
  m.def("decode_layers_(Tensor(a!) residual, Tensor cos, Tensor sin, Tensor slot_mapping, Tensor block_tables, "
        "Tensor lengths, Tensor[] key_caches, Tensor[] value_caches, Tensor[] key_scales, Tensor[] value_scales, "
        "Tensor[] weights, int[] kinds, "
        "int heads, int kv_heads, float eps, float scale, bool fine=False) -> ()");
}

TORCH_LIBRARY_IMPL(kvasir_kernels, CPU, m) { m.impl("decode_layers_", kvasir::decode_layers_); }
