// Reads the CUDA path's LILY_* switches once (the only place they are read; docs/kernel-options.md).
#include "model/kernel_options.h"

#include <cstdlib>
#include <sstream>

namespace lily {

cuda::KernelOptions parse_kernel_options(const std::function<const char*(const char*)>& env) {
  auto flag = [&](const char* name, bool dflt) {
    const char* e = env(name);
    return e && e[0] == (dflt ? '0' : '1') ? !dflt : dflt;
  };
  auto integer = [&](const char* name, int dflt) {
    const char* e = env(name);
    return e && e[0] ? std::atoi(e) : dflt;
  };
  cuda::KernelOptions o;
  o.gdn_fused = flag("LILY_GDN_FUSED", o.gdn_fused);
  o.moe_fused = flag("LILY_MOE_FUSED", o.moe_fused);
  o.attn_splits = integer("LILY_ATTN_SPLITS", o.attn_splits);
  o.prefill = flag("LILY_PREFILL", o.prefill);
  o.prefill_chunk = integer("LILY_PREFILL_CHUNK", o.prefill_chunk);
  o.prefill_min = integer("LILY_PREFILL_MIN", o.prefill_min);
  o.batch_graph_rows = integer("LILY_BATCH_GRAPH_ROWS", o.batch_graph_rows);
  o.gdn_wy = flag("LILY_GDN_WY", o.gdn_wy);
  o.prompt_gemm_f16 = flag("LILY_PROMPT_GEMM_F16", o.prompt_gemm_f16);
  o.prompt_attn_one_term = flag("LILY_PROMPT_ATTN_1TERM", o.prompt_attn_one_term);
  o.prompt_attn_wgmma = flag("LILY_PROMPT_ATTN_WG", o.prompt_attn_wgmma);
  o.batch_pass_graphs = flag("LILY_BATCH_PASS_GRAPHS", o.batch_pass_graphs);
  o.gemm_rows = flag("LILY_GEMM_ROWS", o.gemm_rows);
  o.moe_rows = flag("LILY_MOE_ROWS", o.moe_rows);
  o.moe_fused_rows = integer("LILY_MOE_FUSED_ROWS", o.moe_fused_rows);
  o.moe_fold_rows = integer("LILY_MOE_FOLD_ROWS", o.moe_fold_rows);
  o.gemm_i8 = flag("LILY_GEMM_I8", o.gemm_i8);
  o.gemm_i8_in_rows = integer("LILY_GEMM_I8_IN_ROWS", o.gemm_i8_in_rows);
  o.gemm_i8_out_rows = integer("LILY_GEMM_I8_OUT_ROWS", o.gemm_i8_out_rows);
  o.device_masks = flag("LILY_DEVICE_MASKS", o.device_masks);
  o.debug_sync = flag("LILY_CUDA_SYNC", o.debug_sync);
  o.trace = flag("LILY_TRACE", o.trace);
  if (const char* e = env("LILY_PROMPT_X1")) o.prompt_x_one_term = e;
  if (const char* e = env("LILY_PROMPT_GEMM_WS")) o.prompt_gemm_ws = e;
  if (const char* e = env("LILY_SKIP")) o.skip = e;
  return o;
}

const cuda::KernelOptions& kernel_options_from_env() {
  static const cuda::KernelOptions o = parse_kernel_options([](const char* name) { return std::getenv(name); });
  return o;
}

std::string describe(const cuda::KernelOptions& o) {
  std::ostringstream s;
  auto num = [](int v) { return v > 0 ? std::to_string(v) : std::string("auto"); };
  s << "gdn_fused=" << o.gdn_fused << " moe_fused=" << o.moe_fused << " attn_splits=" << num(o.attn_splits)
    << " prefill=" << o.prefill << " prefill_chunk=" << num(o.prefill_chunk) << " prefill_min=" << num(o.prefill_min)
    << " batch_graph_rows=" << o.batch_graph_rows << " gdn_wy=" << o.gdn_wy
    << " prompt_gemm_f16=" << o.prompt_gemm_f16
    << " prompt_gemm_ws=" << (o.prompt_gemm_ws.empty() ? "-" : o.prompt_gemm_ws)
    << " prompt_x_one_term=" << (o.prompt_x_one_term.empty() ? "-" : o.prompt_x_one_term)
    << " prompt_attn_one_term=" << o.prompt_attn_one_term
    << " prompt_attn_wgmma=" << o.prompt_attn_wgmma
    << " batch_pass_graphs=" << o.batch_pass_graphs
    << " gemm_rows=" << o.gemm_rows << " moe_rows=" << o.moe_rows << " moe_fused_rows=" << o.moe_fused_rows
    << " moe_fold_rows=" << o.moe_fold_rows << " gemm_i8=" << o.gemm_i8
    << " gemm_i8_in_rows=" << o.gemm_i8_in_rows << " gemm_i8_out_rows=" << o.gemm_i8_out_rows
    << " debug_sync=" << o.debug_sync << " trace=" << o.trace
    << " skip=" << (o.skip.empty() ? "-" : o.skip);
  return s.str();
}

}  // namespace lily

namespace lily::cuda {
// CUDA_CHECK_LAUNCH's switch (kernels/common.cuh): the start-up options' debug_sync.
bool debug_sync_enabled() { return kernel_options_from_env().debug_sync; }
}  // namespace lily::cuda
