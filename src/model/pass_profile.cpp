#include "model/pass_profile.h"

namespace lily {

FamilyFlops::FamilyFlops(const Config& c) {
  const double H = c.hidden, Hv = c.lin_v_heads, vd = c.value_dim(), od = static_cast<double>(c.n_heads) * c.head_dim;
  const double kvd = static_cast<double>(c.n_kv_heads) * c.head_dim;
  gdn_in = 2 * H * (c.conv_dim() + vd + 2 * Hv);
  gdn_core = 6 * Hv * c.lin_k_dim * c.lin_v_dim;
  gdn_out = 2 * vd * H;
  attn_in = 2 * H * (c.q_proj_rows() + 2 * kvd);
  attn_out = 2 * od * H;
  attn_pair = 4 * od;
  router = 2 * H * (c.n_experts + 1);
  shared_gate_up = 4 * H * c.shared_ffn;
  shared_down = 2 * c.shared_ffn * H;
  expert_gate_up = 4 * H * c.moe_ffn;
  expert_down = 2 * c.moe_ffn * H;
  lm_head = 2 * H * c.vocab;
}

FamilyTime gemm_total(const std::vector<FamilyTime>& rows) {
  FamilyTime t;
  t.name = "(all gemm_*)";
  for (const FamilyTime& f : rows)
    if (f.name.rfind("gemm_", 0) == 0) t.ms += f.ms, t.flops += f.flops, t.marks += f.marks;
  return t;
}

FamilyTime& FamilyTable::row(const std::string& name) {
  for (FamilyTime& r : rows_)
    if (r.name == name) return r;
  rows_.push_back({name, 0, 0, 0});
  return rows_.back();
}

void FamilyTable::add(const std::string& name, double ms, double flops) {
  FamilyTime& r = row(name);
  r.ms += ms;
  r.flops += flops;
}

void FamilyTable::count(const std::string& name, double flops) {
  FamilyTime& r = row(name);
  r.flops += flops;
  ++r.marks;
}

void WallClockProfiler::mark(const char* family, double flops) {
  const Clock::time_point now = Clock::now();
  if (!open_.empty()) table_.add(open_, std::chrono::duration<double, std::milli>(now - since_).count(), 0);
  table_.count(family, flops);
  open_ = family;
  since_ = now;
}

std::vector<FamilyTime> WallClockProfiler::finish() {
  if (!open_.empty()) table_.add(open_, std::chrono::duration<double, std::milli>(Clock::now() - since_).count(), 0);
  std::vector<FamilyTime> out = table_.rows();
  table_.clear();
  open_.clear();
  return out;
}

}  // namespace lily
