// Time per kernel family of a forward pass (`lily bench --prompts`). The forward marks the start of each family's
// work with the family's useful floating-point operations; the profiler gives the time from one mark to the next
// to the family of the first. Families (both backends): embed, norm (RMSNorm and the GEMM inputs' preparation),
// gemm_gdn_in, gdn_core, gemm_gdn_out, gemm_attn_in, attn_core, gemm_attn_out, gemm_router, routing,
// gemm_shared, gemm_experts_gate_up, gemm_experts_down, combine, lm_head, and "host": from the end of a pass to
// the next mark (the device idle while the host stages the next piece; the loop's own work on the CPU); on the
// CUDA backend a decode pass of a few rows has moe_fused instead of the MoE block's families (one launch).
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "model/config.h"

namespace lily {

// The useful FLOPs (2 per multiply-add) each family marks, per row: the one definition both backends use.
struct FamilyFlops {
  explicit FamilyFlops(const Config& c);
  double gdn_in, gdn_core, gdn_out;            // per token (gdn_core: the recurrence's k^T S, update, q^T S)
  double attn_in, attn_out, attn_pair;         // per token; attn_pair per (query, key) pair of the causal attention
  double router;                               // per token: the router and the shared expert's gate
  double shared_gate_up, shared_down;          // per token
  double expert_gate_up, expert_down;          // per expert slot (top_k per token)
  double lm_head;                              // per row of logits
  // (query, key) pairs of n queries at positions pos0 .. pos0 + n - 1 attending causally
  static double causal_pairs(int n, int pos0) { return static_cast<double>(n) * pos0 + n * (n + 1.0) / 2; }
};

struct FamilyTime {
  std::string name;
  double ms = 0;       // summed over the profiled passes
  double flops = 0;    // useful operations (2 per multiply-add), 0 where not counted
  int marks = 0;       // how many times the family was entered
};

class PassProfiler {
 public:
  virtual ~PassProfiler() = default;
  // Before a family's work (the time until the next mark is the family's); flops are added to the family.
  virtual void mark(const char* family, double flops = 0) = 0;
};

// The gemm_* families of a table summed, as one row named "(all gemm_*)".
FamilyTime gemm_total(const std::vector<FamilyTime>& rows);

// Accumulates (family, ms, flops) in the order families first appear.
class FamilyTable {
 public:
  void add(const std::string& name, double ms, double flops);
  void count(const std::string& name, double flops);  // a mark without time yet
  const std::vector<FamilyTime>& rows() const { return rows_; }
  void clear() { rows_.clear(); }

 private:
  FamilyTime& row(const std::string& name);
  std::vector<FamilyTime> rows_;
};

// The CPU forward's profiler: wall-clock time between marks (the CPU forward is synchronous).
class WallClockProfiler : public PassProfiler {
 public:
  void mark(const char* family, double flops = 0) override;
  // Closes the last family at now and returns the table (the profiler starts over).
  std::vector<FamilyTime> finish();

 private:
  using Clock = std::chrono::steady_clock;
  FamilyTable table_;
  std::string open_;            // the family being timed ("" before the first mark)
  Clock::time_point since_;
};

}  // namespace lily
