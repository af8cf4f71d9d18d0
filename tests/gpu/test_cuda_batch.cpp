// The CUDA batch backend (runtime/cuda_batch_backend.cuh) on the golden tiny checkpoints: sequences stepped
// together in mixed steps (prompt pieces and decode tokens) against the CPU reference (the prompt path's bf16 KV
// cache: ~1e-3 of the logits' scale, as test_cuda_backend) and against the same sequences stepped alone
// (isolation: within 1e-3 relative; the worst is printed, and whether it is bit for bit); KV copied between slots
// with a restored snapshot; the scheduler over it against transformers' greedy continuations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "model/forward_cpu.h"
#include "runtime/cuda_backend.h"
#include "runtime/scheduler.h"

using namespace lily;

namespace {

const std::string kGolden = std::string(LILY_SOURCE_DIR) + "/tests/data/golden/";

CudaOptions small_opts() {
  CudaOptions o;
  o.max_context = 4096;
  o.progress = false;
  return o;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, worst = 0;
  for (float v : b) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::isfinite(a[i]) ? std::fabs(static_cast<double>(a[i]) - b[i]) / scale : INFINITY);
  return worst;
}

struct Seq {
  std::vector<int32_t> tokens;         // every token the sequence consumes
  std::vector<int> cuts;               // piece ends; the logits after each are checked
};

// The pieces of each sequence, stepped together (step s takes piece s of every sequence that has one) or, with
// `only` >= 0, that sequence alone in slot 0. Returns the logits after every piece, per sequence.
std::vector<std::vector<std::vector<float>>> run(BatchBackend& be, const std::vector<Seq>& seqs, int only) {
  const int V = be.config().vocab;
  std::vector<std::vector<std::vector<float>>> out(seqs.size());
  for (int s = 0; s < be.max_seqs(); ++s) be.reset(s);
  for (size_t step = 0;; ++step) {
    std::vector<BatchEntry> batch;
    for (size_t q = 0; q < seqs.size(); ++q) {
      if (only >= 0 && static_cast<int>(q) != only) continue;
      if (step >= seqs[q].cuts.size()) continue;
      const int from = step == 0 ? 0 : seqs[q].cuts[step - 1], to = seqs[q].cuts[step];
      out[q].emplace_back(V);
      batch.push_back({only >= 0 ? 0 : static_cast<int>(q),
                       std::span<const int32_t>(seqs[q].tokens.data() + from, static_cast<size_t>(to - from)),
                       out[q].back().data()});
    }
    if (batch.empty()) break;
    if (step % 2) std::reverse(batch.begin(), batch.end());  // the order of entries must not matter
    be.step(batch);
  }
  return out;
}

// graph_rows: the backend's one-token rows through each slot's decode graph (12: every step here) or through the
// prompt-path pass (0).
void mixed_steps(const std::string& layout, int graph_rows) {
  const Model model = load_model(kGolden + layout);
  auto single = make_cuda_backend(model, small_opts());
  auto be = make_cuda_batch_backend(*single, 4, graph_rows);
  ASSERT_TRUE(be) << "the prompt path does not take the golden model's shapes";
  const int V = model.config.vocab;
  std::mt19937 rng(3);
  std::vector<Seq> seqs(4);
  const std::vector<std::vector<int>> cuts = {{20, 37, 38, 39, 40, 41, 42},
                                              {150, 151, 152, 153, 154},
                                              {1, 2, 3, 4, 5, 9, 10, 11},
                                              {33, 80, 81, 82, 83, 84, 85, 86}};
  for (size_t q = 0; q < seqs.size(); ++q) {
    seqs[q].cuts = cuts[q];
    for (int t = 0; t < cuts[q].back(); ++t) seqs[q].tokens.push_back(static_cast<int32_t>(rng() % V));
  }
  const auto together = run(*be, seqs, -1);
  double worst_alone = 0, worst_cpu = 0;
  bool exact = true;
  for (size_t q = 0; q < seqs.size(); ++q) {
    const auto alone = run(*be, seqs, static_cast<int>(q));
    CpuForward cpu(model);
    for (size_t p = 0; p < seqs[q].cuts.size(); ++p) {
      const int from = p == 0 ? 0 : seqs[q].cuts[p - 1], to = seqs[q].cuts[p];
      std::vector<float> ref(V);
      cpu.forward(std::span<const int32_t>(seqs[q].tokens.data() + from, static_cast<size_t>(to - from)), ref.data(),
                  false);
      const double a = rel_diff(together[q][p], alone[q][p]), c = rel_diff(together[q][p], ref);
      exact = exact && std::memcmp(together[q][p].data(), alone[q][p].data(), sizeof(float) * V) == 0;
      worst_alone = std::max(worst_alone, a);
      worst_cpu = std::max(worst_cpu, c);
      EXPECT_LE(a, 1e-3) << layout << " sequence " << q << " piece " << p << ": batched vs alone";
      EXPECT_LT(c, 1e-2) << layout << " sequence " << q << " piece " << p << ": vs the CPU reference";
    }
  }
  std::printf("%s, %s: batched vs alone worst %.3g (%s), vs CPU worst %.3g\n", layout.c_str(),
              graph_rows > 0 ? "decode graphs" : "passes only", worst_alone, exact ? "bit for bit" : "not bit for bit",
              worst_cpu);
}

}  // namespace

TEST(CudaBatch, MixedStepsMatchAloneAndTheCpuHf) { mixed_steps("hf", 12); }
TEST(CudaBatch, MixedStepsMatchAloneAndTheCpuMlx) { mixed_steps("mlx", 12); }
TEST(CudaBatch, PassesOnlyMatchAloneAndTheCpuHf) { mixed_steps("hf", 0); }
TEST(CudaBatch, PassesOnlyMatchAloneAndTheCpuMlx) { mixed_steps("mlx", 0); }

// Pass graphs (KernelOptions::batch_pass_graphs): a pass of one-token rows replayed from the graph captured at its
// key's second pass gives the bits of the same pass run directly. Four prompts, then one-token steps as the
// sequences run out (4, 3, 2, 1 rows), one sequence past positions 512 and 1,024 (attention splits 2, then 3: the
// split scratch grows, the graphs are dropped and captured again).
TEST(CudaBatch, PassGraphsGiveTheDirectPassesBits) {
  const Model model = load_model(kGolden + "mlx");
  const int V = model.config.vocab;
  std::mt19937 rng(5);
  const int prompt[4] = {600, 700, 10, 1000}, steps[4] = {40, 30, 50, 36};
  std::vector<Seq> seqs(4);
  for (int q = 0; q < 4; ++q) {
    seqs[q].cuts.push_back(prompt[q]);
    for (int i = 1; i <= steps[q]; ++i) seqs[q].cuts.push_back(prompt[q] + i);
    for (int t = 0; t < seqs[q].cuts.back(); ++t) seqs[q].tokens.push_back(static_cast<int32_t>(rng() % V));
  }
  std::vector<std::vector<std::vector<float>>> res[2];
  for (bool graphs : {false, true}) {
    CudaOptions o = small_opts();
    o.kernels.batch_pass_graphs = graphs;
    auto single = make_cuda_backend(model, o);
    auto be = make_cuda_batch_backend(*single, 4, 0);
    ASSERT_TRUE(be);
    res[graphs] = run(*be, seqs, -1);
  }
  size_t differ = 0, pieces = 0;
  for (int q = 0; q < 4; ++q)
    for (size_t p = 0; p < seqs[q].cuts.size(); ++p, ++pieces)
      if (std::memcmp(res[0][q][p].data(), res[1][q][p].data(), sizeof(float) * V) != 0) {
        if (differ++ < 5) ADD_FAILURE() << "sequence " << q << " piece " << p << ": graph and direct pass differ";
      }
  EXPECT_EQ(differ, 0u) << differ << " of " << pieces << " pieces";
}

TEST(CudaBatch, CopyPrefixAndRestoreContinueAlike) {
  const Model model = load_model(kGolden + "hf");
  auto single = make_cuda_backend(model, small_opts());
  auto be = make_cuda_batch_backend(*single, 2);
  ASSERT_TRUE(be);
  const int V = model.config.vocab;
  std::vector<int32_t> t(45);
  for (int i = 0; i < 45; ++i) t[static_cast<size_t>(i)] = (i * 37 + 11) % V;
  be->reset(0);
  be->reset(1);
  be->step(std::vector<BatchEntry>{{0, std::span<const int32_t>(t.data(), 40), nullptr}});
  const StateSnapshot snap = be->save_state(0);
  EXPECT_TRUE(snap.device) << "a snapshot in the backend's device pool (no host copy, no synchronisation)";
  be->step(std::vector<BatchEntry>{{0, std::span<const int32_t>(t.data() + 40, 3), nullptr}});  // moves on
  be->copy_prefix(1, 0, 40);
  be->restore_state(1, snap);
  be->restore_state(0, snap);
  EXPECT_EQ(be->position(0), 40);
  EXPECT_EQ(be->position(1), 40);
  std::vector<float> a(V), b(V);
  be->step(std::vector<BatchEntry>{{0, std::span<const int32_t>(t.data() + 40, 5), a.data()},
                                   {1, std::span<const int32_t>(t.data() + 40, 5), b.data()}});
  EXPECT_LE(rel_diff(a, b), 1e-3);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * V), 0) << "the same state and tokens in one step";
  EXPECT_THROW(be->step(std::vector<BatchEntry>{{0, std::span<const int32_t>(t.data(), 1), nullptr},
                                                {0, std::span<const int32_t>(t.data(), 1), nullptr}}),
               Error);
  EXPECT_EQ(be->position(0), 45);
}

TEST(CudaBatch, SchedulerGreedyMatchesTransformers) {
  const std::string dir = kGolden + "hf";
  const Model model = load_model(dir);
  auto single = make_cuda_backend(model, small_opts());
  auto be = make_cuda_batch_backend(*single, 4);
  ASSERT_TRUE(be);
  std::ifstream f(dir + "/golden/golden.json");
  const nlohmann::json g = nlohmann::json::parse(f);
  SchedulerOptions so;
  so.prefill_chunk = 64;  // prompts in pieces between the others' decode ids
  Scheduler sch(*be, so);
  struct Case {
    std::vector<int32_t> expect, got;
    int checked = 0;                    // leading ids whose reference margin clears the GPU's error
  };
  std::vector<Case> cases;
  for (const auto& c : g["cases"]) {
    Case k;
    k.expect = c["greedy"].get<std::vector<int32_t>>();
    const std::vector<double> margins = c["margins"].get<std::vector<double>>();
    const double max_logit = c["max_abs_logit"].get<double>();
    while (k.checked < static_cast<int>(k.expect.size()) && margins[static_cast<size_t>(k.checked)] >= 4e-2 * max_logit)
      ++k.checked;
    cases.push_back(k);
  }
  size_t i = 0;
  for (const auto& c : g["cases"]) {
    SeqSpec s;
    s.prompt = c["prompt"].get<std::vector<int32_t>>();
    s.max_tokens = static_cast<int>(cases[i].expect.size());
    s.sampling.params.temperature = 0;
    std::vector<int32_t>* got = &cases[i].got;
    s.on_token = [got](const SampledToken& t, int, bool) {
      got->push_back(t.token);
      return FinishReason::none;
    };
    sch.add(std::move(s));
    ++i;
  }
  while (!sch.idle()) sch.step();
  for (size_t k = 0; k < cases.size(); ++k) {
    ASSERT_EQ(cases[k].got.size(), cases[k].expect.size()) << "case " << k;
    for (int s = 0; s < cases[k].checked; ++s) ASSERT_EQ(cases[k].got[s], cases[k].expect[s]) << "case " << k << " id " << s;
  }
}

namespace {

// Says it draws nothing: the scheduler samples on the host from copied logits.
class HostDraws : public ForwardingBatchBackend {
 public:
  using ForwardingBatchBackend::ForwardingBatchBackend;
  bool draws(const SamplingParams&) const override { return false; }
};

// Six sequences with chat-like sampling (temperature, top-k, top-p, presence and repetition penalties, a
// logit_bias, top_logprobs) through the scheduler, the ids drawn on the device or on the host.
std::vector<std::vector<SampledToken>> sampled_run(BatchBackend& be, const std::vector<std::vector<int32_t>>& prompts) {
  SchedulerOptions so;
  so.prefill_chunk = 32;
  so.prefix_cache = false;
  Scheduler sch(be, so);
  std::vector<std::vector<SampledToken>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    SeqSpec s;
    s.prompt = prompts[i];
    s.max_tokens = 40;
    SamplingParams& p = s.sampling.params;
    p.temperature = 0.8f;
    p.top_k = i % 2 ? 20 : 0;   // the fast path and the full-vocabulary path
    p.top_p = 0.9f;
    p.presence_penalty = 1.5f;
    p.repetition_penalty = i % 3 ? 1.1f : 1.0f;
    p.seed = 1000 + i;
    p.top_logprobs = i == 0 ? 5 : 0;
    if (i == 1) p.logit_bias = {{prompts[i][0], 3.0f}};
    s.sampling.logprobs = true;
    auto* o = &out[i];
    s.on_token = [o](const SampledToken& t, int, bool) {
      o->push_back(t);
      return FinishReason::none;
    };
    sch.add(std::move(s));
  }
  while (!sch.idle()) sch.step();
  return out;
}

}  // namespace

// The batch backend's device draws against the scheduler's host Sampler on the same logits: the same ids (the two
// differ only in the order of float sums: a draw landing within ~1e-6 of a boundary, negligible over 240 ids)
// and log-probabilities within 1e-4; the penalties' counts follow each sequence through decode graphs and passes.
TEST(CudaBatch, DeviceDrawsMatchTheHostSampler) {
  const Model model = load_model(kGolden + "hf");
  auto single = make_cuda_backend(model, small_opts());
  auto be = make_cuda_batch_backend(*single, 4, 2);  // steps of 1-2 decoding rows use graphs, more a pass
  ASSERT_TRUE(be);
  SamplingParams probe;
  ASSERT_TRUE(be->draws(probe));
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts(6);
  for (auto& p : prompts)
    for (int t = 0, n = 10 + static_cast<int>(rng() % 50); t < n; ++t)
      p.push_back(static_cast<int32_t>(rng() % model.config.vocab));
  const auto dev = sampled_run(*be, prompts);
  HostDraws host_be(*be);
  const auto host = sampled_run(host_be, prompts);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(dev[i].size(), host[i].size()) << "sequence " << i;
    for (size_t k = 0; k < dev[i].size(); ++k) {
      ASSERT_EQ(dev[i][k].token, host[i][k].token) << "sequence " << i << " id " << k;
      EXPECT_NEAR(dev[i][k].logprob, host[i][k].logprob, 1e-4) << "sequence " << i << " id " << k;
      ASSERT_EQ(dev[i][k].top.size(), host[i][k].top.size()) << "sequence " << i << " id " << k;
      for (size_t j = 0; j < dev[i][k].top.size(); ++j) EXPECT_EQ(dev[i][k].top[j].token, host[i][k].top[j].token);
    }
  }
}
