// `lily info --model DIR`: loads and validates a checkpoint and prints the resolved architecture, layer
// schedule, parameter counts, storage per tensor family and the bytes one decode step reads (docs/model.md §7-8).
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "model/model_stats.h"
#include "model/weights.h"
#include "server/served_model.h"
#include "util/safetensors.h"

namespace lily::cli {
namespace {

std::string fmt_mat(const Mat& m) {
  char buf[96];
  if (m.format == MatFormat::affine)
    std::snprintf(buf, sizeof buf, "affine %d-bit gs %d", m.bits, m.group_size);
  else
    std::snprintf(buf, sizeof buf, "%s", m.format == MatFormat::bf16 ? "bf16" : "f32");
  return buf;
}

std::string commas(uint64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

int run_info(const std::string& dir) {
  const server::ModelFiles files = server::check_model_files(dir);  // the same checks as `serve`, weights aside
  Model m = load_model(dir);
  const Config& c = m.config;
  const Weights& w = m.weights;
  TensorStore store = TensorStore::open_dir(dir);
  std::printf("model              %s\n", dir.c_str());
  std::printf("layout             %s\n", w.layout == CheckpointLayout::hf_bf16 ? "HF bf16 (model.language_model.*)"
                                                                               : "MLX (language_model.model.*)");
  std::printf("model_type         %s\n", c.model_type.c_str());
  std::printf("hidden %d, layers %d, vocab %d, eps %g, tie_word_embeddings %s, max_position %d\n", c.hidden,
              c.n_layers, c.vocab, c.eps, c.tie_word_embeddings ? "true" : "false", c.max_position_embeddings);
  std::printf("attention          %d heads, %d kv heads, head_dim %d, rope %d dims theta %g\n", c.n_heads,
              c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_theta);
  std::printf("gated deltanet     %d k heads x %d, %d v heads x %d, conv kernel %d (conv_dim %d)\n", c.lin_k_heads,
              c.lin_k_dim, c.lin_v_heads, c.lin_v_dim, c.conv_kernel, c.conv_dim());
  std::printf("moe                %d experts, top %d, ffn %d, shared ffn %d\n", c.n_experts, c.top_k, c.moe_ffn,
              c.shared_ffn);
  std::string sched;
  for (int i = 0; i < c.n_layers; ++i) sched += c.is_attention(i) ? 'A' : 'G';
  std::printf("layer schedule     %s (G = gated deltanet, A = attention; interval %d, %d attention layers)\n",
              sched.c_str(), c.full_attention_interval, c.n_attention_layers());
  std::printf("tokens             bos %d, eos", c.bos_token_id);
  for (int e : c.eos_token_ids) std::printf(" %d", e);
  std::printf("\n");
  std::printf("tokenizer          %d ids (vocab_size %d), <|im_end|> %d; chat template renders\n", files.n_vocab,
              c.vocab, files.im_end);
  ParamCounts p = count_parameters(c);
  std::printf("parameters         %s text, %s active per token\n", commas(p.text_total).c_str(),
              commas(p.active).c_str());
  std::printf("bytes on disk      %s (%zu tensors)\n", commas(w.bytes_on_disk).c_str(), store.size());
  int gl = -1, al = -1;
  for (int i = c.n_layers - 1; i >= 0; --i) (c.is_attention(i) ? al : gl) = i;  // first layer of each kind
  std::printf("storage\n  embed_tokens       %s\n  lm_head            %s\n", fmt_mat(w.embed_tokens).c_str(),
              fmt_mat(w.lm_head).c_str());
  if (gl >= 0) {
    const auto& g = w.layers[gl].gdn;
    std::printf("  gdn qkv/z/a/b/out  %s / %s / %s / %s / %s\n", fmt_mat(g.in_proj_qkv).c_str(),
                fmt_mat(g.in_proj_z).c_str(), fmt_mat(g.in_proj_a).c_str(), fmt_mat(g.in_proj_b).c_str(),
                fmt_mat(g.out_proj).c_str());
  }
  if (al >= 0) {
    const auto& a = w.layers[al].attn;
    std::printf("  attn q/k/v/o       %s / %s / %s / %s\n", fmt_mat(a.q_proj).c_str(), fmt_mat(a.k_proj).c_str(),
                fmt_mat(a.v_proj).c_str(), fmt_mat(a.o_proj).c_str());
  }
  const auto& moe = w.layers[0].moe;
  std::printf("  router             %s\n  shared_expert_gate %s\n  experts g/u/d      %s / %s / %s\n"
              "  shared expert      %s / %s / %s\n",
              fmt_mat(moe.gate).c_str(), fmt_mat(moe.shared_expert_gate).c_str(), fmt_mat(moe.experts_gate[0]).c_str(),
              fmt_mat(moe.experts_up[0]).c_str(), fmt_mat(moe.experts_down[0]).c_str(),
              fmt_mat(moe.shared_gate).c_str(), fmt_mat(moe.shared_up).c_str(), fmt_mat(moe.shared_down).c_str());
  DecodeBytes b = decode_bytes(m, store);
  std::printf("bytes read per decoded token (batch 1)\n");
  auto line = [&](const char* what, uint64_t v) {
    std::printf("  %-22s %18s  %5.1f%%\n", what, commas(v).c_str(), 100.0 * v / b.weights_total);
  };
  line("gdn mixers", b.gdn);
  line("routed experts", b.experts);
  line("lm_head", b.lm_head);
  line("attention", b.attn);
  line("shared experts", b.shared);
  line("routers + shared gate", b.routers);
  line("rmsnorm weights", b.norms);
  line("embedding row", b.embed_row);
  std::printf("  %-22s %18s  (%.3f GB)\n", "weights total", commas(b.weights_total).c_str(), b.weights_total / 1e9);
  std::printf("  %-22s %18s\n", "gdn state r+w (fp32)", commas(b.gdn_state).c_str());
  std::printf("  %-22s %18s\n", "conv state r+w (bf16)", commas(b.conv_state).c_str());
  std::printf("  %-22s %18s  x context length\n", "kv cache read (bf16)", commas(b.kv_per_token).c_str());
  return 0;
}

CommandRegistrar reg{Command{"info", "validate a checkpoint and print its architecture and sizes", [](CLI::App& sub) {
                               auto dir = std::make_shared<std::string>();
                               sub.add_option("--model", *dir, "checkpoint directory")->required();
                               return [dir]() { return run_info(*dir); };
                             }}};

}  // namespace
}  // namespace lily::cli
