// `lily bench --prompts` on the CPU backend (golden hf model): the prompts go through the server's loop in its
// pieces, and the profiled run's families are the forward's, each with the useful FLOPs its shapes give.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "runtime/bench_prompt.h"
#include "runtime/cpu_backend.h"

using namespace lily;

TEST(BenchPrompt, FamiliesAndTheirFlopsFollowTheShapes) {
  const Model model = load_model(std::string(LILY_SOURCE_DIR) + "/tests/data/golden/hf");
  const Config& c = model.config;
  CpuBackend be(model, 1024);
  PromptBenchOptions o;
  o.prompts = {40, 300, 5000};  // 5000: past the context, skipped
  o.piece = 128;                // 300 tokens in three pieces, each a forward of its own
  o.checkpoint_interval = 100;
  o.runs = 2;
  const std::vector<PromptPoint> pts = run_prompt_bench(be, o);
  ASSERT_EQ(pts.size(), 2u);

  int n_gdn = 0, n_attn = 0;
  for (int i = 0; i < c.n_layers; ++i) (c.is_attention(i) ? n_attn : n_gdn)++;
  ASSERT_GT(n_gdn, 0);
  ASSERT_GT(n_attn, 0);
  const double H = c.hidden, V = c.vocab, E = c.n_experts, k = c.top_k, F = c.moe_ffn, Fs = c.shared_ffn;
  const double Hv = c.lin_v_heads, vd = c.value_dim(), C = c.conv_dim();
  const double od = static_cast<double>(c.n_heads) * c.head_dim, kvd = static_cast<double>(c.n_kv_heads) * c.head_dim;
  for (const PromptPoint& p : pts) {
    SCOPED_TRACE("prompt of " + std::to_string(p.tokens));
    EXPECT_EQ(p.runs, 2);
    EXPECT_GT(p.ttft_ms, 0);
    EXPECT_GT(p.profiled_ms, 0);
    const double n = p.tokens;
    const std::map<std::string, double> want = {
        {"embed", 0},
        {"norm", 0},
        {"gemm_gdn_in", n_gdn * 2 * n * H * (C + vd + 2 * Hv)},
        {"gdn_core", n_gdn * 6 * n * Hv * c.lin_k_dim * c.lin_v_dim},
        {"gemm_gdn_out", n_gdn * 2 * n * vd * H},
        {"gemm_attn_in", n_attn * 2 * n * H * (c.q_proj_rows() + 2 * kvd)},
        {"attn_core", n_attn * 4 * od * n * (n + 1) / 2},  // causal: the pieces' pairs add to the prompt's
        {"gemm_attn_out", n_attn * 2 * n * od * H},
        {"gemm_router", c.n_layers * 2 * n * H * (E + 1)},
        {"routing", 0},
        {"gemm_experts_gate_up", c.n_layers * 4 * n * k * H * F},
        {"gemm_experts_down", c.n_layers * 2 * n * k * F * H},
        {"gemm_shared", c.n_layers * 6 * n * H * Fs},
        {"combine", 0},
        {"lm_head", 2 * H * V},  // the last position only
        {"host", 0}};
    std::set<std::string> seen;
    double sum = 0, gemm = 0;
    for (const FamilyTime& f : p.families) {
      EXPECT_TRUE(seen.insert(f.name).second) << f.name << " twice";
      ASSERT_TRUE(want.count(f.name)) << "unexpected family " << f.name;
      EXPECT_NEAR(f.flops, want.at(f.name), 1e-9 * want.at(f.name)) << f.name;
      EXPECT_GE(f.ms, 0) << f.name;
      EXPECT_GE(f.marks, 1) << f.name;
      sum += f.ms;
      if (f.name.rfind("gemm_", 0) == 0) gemm += f.flops;
    }
    EXPECT_EQ(seen.size(), want.size());
    EXPECT_DOUBLE_EQ(p.gemm_flops, gemm);
    // the families cover the run from its first pass to its first id (the accounting, not a speed)
    EXPECT_GT(sum, 0.5 * p.profiled_ms);
    EXPECT_LT(sum, 1.5 * p.profiled_ms + 5);
  }
  // profiling ends with the run: later passes are not marked
  EXPECT_TRUE(be.profile_end().empty());
}
