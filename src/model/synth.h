// Synthetic checkpoints of this architecture with random weights: a complete model directory (config.json
// in the real wrapper format, generation_config.json, safetensors, shards + index when large) in either
// layout. Deterministic from the seed; written tensor by tensor (never the whole model in memory).
// The two layouts of one seed hold the same bf16 numbers (MLX: quantized with MLX's rule, norms stored 1+w),
// so they describe the same model up to quantization.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/weights.h"

namespace lily {

struct SynthOptions {
  std::string preset = "tiny";  // "tiny" (small, every structural property) or "full" (Qwen3.6-35B-A3B sizes)
  CheckpointLayout layout = CheckpointLayout::hf_bf16;
  uint64_t seed = 1;
  int vocab = 0;                // > 0: override the preset's vocab_size
  int layers = 0;               // > 0: override the preset's num_hidden_layers
  bool tie_word_embeddings = false;
  uint64_t shard_bytes = 0;     // 0: one model.safetensors for tiny, ~4 GB shards for full
  int threads = 0;              // 0: all hardware threads
};

// The config.json contents (wrapper with text_config; MLX layout adds quantization blocks).
nlohmann::json synth_config_json(const SynthOptions& opt);
// The generation_config.json contents.
nlohmann::json synth_generation_config_json(const SynthOptions& opt);
// The resolved Config of synth_config_json (validated by parse_config).
Config synth_config(const SynthOptions& opt);

// Writes the checkpoint into `dir` (created if missing). Returns the bytes written.
uint64_t synth_checkpoint(const std::string& dir, const SynthOptions& opt);

}  // namespace lily
