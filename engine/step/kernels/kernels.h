// The native operations, callable from each other's C++ (the decode step calls the layer operations directly).
#pragma once

#include <ATen/ATen.h>

namespace kvasir {

at::Tensor q4_1_linear(const at::Tensor& input, const at::Tensor& weight_blocks, int64_t in_features,
                       int64_t out_features);
at::Tensor q4_1f_linear(const at::Tensor& input, const at::Tensor& weight_blocks, int64_t in_features,
                        int64_t out_features);
at::Tensor q8_0_linear(const at::Tensor& input, const at::Tensor& weight_blocks, int64_t in_features,
                       int64_t out_features);
// What each row's 8-bit codes leave of it (x - d q, with the codes the linear layers quantise x to): as a second
// row of activations it makes a block layer's output that of x to within the remainder's own 8-bit rounding
at::Tensor activation_remainder(const at::Tensor& input);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm_(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps);
void rotary_qk_(at::Tensor& qkv, int64_t heads, int64_t kv_heads, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor silu_mul(const at::Tensor& gate_up);
// key_scales / value_scales: the q8_0 caches' float16 scales, an empty tensor for the float caches
at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  const at::Tensor& key_scales, const at::Tensor& value_scales,
                                  const at::Tensor& block_tables, const at::Tensor& lengths, int64_t heads,
                                  double scale);
// Writes `count` float values into a KV cache tensor of any stored format (kv_format.py) at element `offset`
// (a multiple of 32 for q8_0, whose `scales` are then written too)
void store_kv(const float* values, int64_t count, at::Tensor& cache, at::Tensor& scales, int64_t offset);

}  // namespace kvasir
