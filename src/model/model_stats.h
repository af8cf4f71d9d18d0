// Sizes derived from a config or a loaded model: parameter counts (docs/model.md §7) and the bytes one decode
// step reads (docs/model.md §8), computed from the Mat views actually loaded.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/weights.h"
#include "util/safetensors.h"

namespace lily {

struct ParamCounts {
  int64_t gdn_mixer = 0;   // one Gated DeltaNet mixer incl. conv, A_log, dt_bias, norm
  int64_t attn_mixer = 0;  // one gated attention mixer incl. q/k norms
  int64_t moe_block = 0;   // routed experts + router + shared expert + shared gate
  int64_t expert = 0;      // one routed expert (gate + up + down)
  int64_t embed = 0;       // embed_tokens (lm_head the same unless tied)
  int64_t text_total = 0;  // 40 layers + embed + head + norms
  int64_t active = 0;      // read per token: mixers, router, top-k + shared experts, norms, lm_head
};
ParamCounts count_parameters(const Config& c);

struct DecodeBytes {  // bytes read per decoded token at batch 1
  uint64_t gdn = 0;          // GDN projections + conv taps + A_log + dt_bias + gated norm
  uint64_t experts = 0;      // top_k routed experts per layer
  uint64_t lm_head = 0;
  uint64_t attn = 0;         // q/k/v/o + q/k norms
  uint64_t shared = 0;       // shared experts
  uint64_t routers = 0;      // router + shared-expert gate
  uint64_t norms = 0;        // input/post-attention layer norms + final norm (stored bytes)
  uint64_t embed_row = 0;    // one embedding row (with its scales/biases)
  uint64_t weights_total = 0;
  uint64_t gdn_state = 0;    // recurrent state read + write (fp32)
  uint64_t conv_state = 0;   // conv state read + write (bf16)
  uint64_t kv_per_token = 0; // KV cache bytes per context token (bf16), read each step
};
// `store` supplies the stored sizes of the small vectors (the model holds them as fp32).
DecodeBytes decode_bytes(const Model& m, const TensorStore& store);

}  // namespace lily
