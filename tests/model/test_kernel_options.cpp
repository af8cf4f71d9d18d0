// The CUDA path's options from LILY_* variables (model/kernel_options.cpp): defaults, each override, and the
// switches' rule ("0" turns a default-on switch off, "1" a default-off one on, anything else leaves it).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "model/kernel_options.h"

namespace lily {
namespace {

cuda::KernelOptions parse(const std::map<std::string, std::string>& vars) {
  return parse_kernel_options([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(KernelOptions, DefaultsWhenNothingIsSet) {
  const cuda::KernelOptions o = parse({});
  const cuda::KernelOptions d;
  EXPECT_TRUE(o.gdn_fused);
  EXPECT_TRUE(o.moe_fused);
  EXPECT_TRUE(o.prefill);
  EXPECT_FALSE(o.debug_sync);
  EXPECT_FALSE(o.trace);
  EXPECT_TRUE(o.prompt_attn_one_term);
  EXPECT_TRUE(o.prompt_attn_wgmma);
  EXPECT_TRUE(o.gemm_rows);
  EXPECT_TRUE(o.batch_pass_graphs);
  EXPECT_TRUE(o.gdn_wy);
  EXPECT_TRUE(o.prompt_gemm_f16);
  EXPECT_EQ(o.prompt_gemm_ws, d.prompt_gemm_ws);
  EXPECT_EQ(o.moe_fused_rows, d.moe_fused_rows);
  EXPECT_EQ(o.attn_splits, d.attn_splits);
  EXPECT_EQ(o.prefill_chunk, d.prefill_chunk);
  EXPECT_EQ(o.prefill_min, d.prefill_min);
  EXPECT_TRUE(o.skip.empty());
  EXPECT_EQ(o.prompt_x_one_term, d.prompt_x_one_term);
  EXPECT_FALSE(d.prompt_x_one_term.empty());
}

TEST(KernelOptions, EachVariableSetsItsField) {
  const cuda::KernelOptions o =
      parse({{"LILY_GDN_FUSED", "0"}, {"LILY_MOE_FUSED", "0"}, {"LILY_ATTN_SPLITS", "33"}, {"LILY_PREFILL", "0"},
             {"LILY_PREFILL_CHUNK", "512"}, {"LILY_PREFILL_MIN", "40"}, {"LILY_CUDA_SYNC", "1"}, {"LILY_TRACE", "1"},
             {"LILY_SKIP", "moe,lm_head"}, {"LILY_GEMM_ROWS", "0"},
             {"LILY_BATCH_PASS_GRAPHS", "0"}, {"LILY_PROMPT_ATTN_1TERM", "0"}, {"LILY_GEMM_I8_IN_ROWS", "8"},
             {"LILY_GEMM_I8_OUT_ROWS", "0"}, {"LILY_GDN_WY", "0"}, {"LILY_MOE_FUSED_ROWS", "3"},
             {"LILY_PROMPT_ATTN_WG", "0"}, {"LILY_PROMPT_GEMM_F16", "0"},
             {"LILY_PROMPT_X1", "experts_down,shared"}, {"LILY_PROMPT_GEMM_WS", "gdn_in,experts_down"}});
  EXPECT_FALSE(o.gdn_fused);
  EXPECT_FALSE(o.moe_fused);
  EXPECT_EQ(o.attn_splits, 33);
  EXPECT_FALSE(o.prefill);
  EXPECT_EQ(o.prefill_chunk, 512);
  EXPECT_EQ(o.prefill_min, 40);
  EXPECT_TRUE(o.debug_sync);
  EXPECT_TRUE(o.trace);
  EXPECT_EQ(o.skip, "moe,lm_head");
  EXPECT_FALSE(o.gemm_rows);
  EXPECT_FALSE(o.batch_pass_graphs);
  EXPECT_FALSE(o.prompt_attn_one_term);
  EXPECT_FALSE(o.prompt_attn_wgmma);
  EXPECT_EQ(o.gemm_i8_in_rows, 8);
  EXPECT_EQ(o.gemm_i8_out_rows, 0);
  EXPECT_FALSE(o.gdn_wy);
  EXPECT_EQ(o.moe_fused_rows, 3);
  EXPECT_FALSE(o.prompt_gemm_f16);
  EXPECT_EQ(o.prompt_x_one_term, "experts_down,shared");
  EXPECT_EQ(o.prompt_gemm_ws, "gdn_in,experts_down");
  EXPECT_TRUE(parse({{"LILY_PROMPT_X1", ""}}).prompt_x_one_term.empty());  // (set but empty: none)
}

TEST(KernelOptions, SwitchesOnlyFlipOnTheirOppositeDigit) {
  // "1" for a default-on switch, "0" for a default-off one, empty or other text: the default stays
  const cuda::KernelOptions o = parse({{"LILY_GDN_FUSED", "1"}, {"LILY_MOE_FUSED", "off"}, {"LILY_CUDA_SYNC", "0"},
                                       {"LILY_TRACE", ""}, {"LILY_ATTN_SPLITS", ""}});
  EXPECT_TRUE(o.gdn_fused);
  EXPECT_TRUE(o.moe_fused);
  EXPECT_FALSE(o.debug_sync);
  EXPECT_FALSE(o.trace);
  EXPECT_EQ(o.attn_splits, cuda::KernelOptions{}.attn_splits);
}

TEST(KernelOptions, DescribeNamesEveryFieldWithItsValue) {
  const std::string s = describe(parse({{"LILY_ATTN_SPLITS", "17"}, {"LILY_MOE_FUSED", "0"}, {"LILY_SKIP", "moe"}}));
  for (const char* part : {"gdn_fused=1", "moe_fused=0", "attn_splits=17", "prefill=1", "prefill_chunk=auto",
                           "prefill_min=auto", "debug_sync=0", "trace=0", "skip=moe", "gemm_i8_in_rows=16",
                           "gemm_i8_out_rows=64", "gdn_wy=1", "prompt_attn_wgmma=1", "prompt_gemm_f16=1",
                           "prompt_x_one_term=attn_in", "prompt_gemm_ws=gdn_in,"})
    EXPECT_NE(s.find(part), std::string::npos) << part << " in " << s;
}

}  // namespace
}  // namespace lily
