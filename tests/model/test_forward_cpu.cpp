// CpuForward end to end: transformers float32 logits on the tiny golden checkpoints (both layouts),
// chunked prefill vs token-by-token decode on synthetic checkpoints (both layouts), and state save/restore.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/forward_cpu.h"
#include "model/synth.h"
#include "util/check.h"
#include "util/npy.h"

using namespace lily;

namespace {

const std::string kGolden = std::string(LILY_SOURCE_DIR) + "/tests/data/golden/";

struct Worst {
  double rel = 0;  // |a - b| / max|b|
  int64_t at = -1;
};

Worst compare(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0;
  for (float v : b) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  Worst w;
  for (size_t i = 0; i < a.size(); ++i) {
    const double r = std::fabs(static_cast<double>(a[i]) - b[i]) / scale;
    if (r > w.rel || std::isnan(a[i])) w.rel = std::isnan(a[i]) ? INFINITY : r, w.at = static_cast<int64_t>(i);
  }
  return w;
}

void check_golden(const std::string& layout) {
  const std::string dir = kGolden + layout;
  Model model = load_model(dir);
  ThreadPool pool(2);
  CpuForward be(model, 0, &pool);
  std::ifstream f(dir + "/golden/golden.json");
  nlohmann::json g = nlohmann::json::parse(f);
  const int V = g["vocab"];
  ASSERT_EQ(V, model.config.vocab);
  for (const auto& c : g["cases"]) {
    std::vector<int32_t> prompt = c["prompt"].get<std::vector<int32_t>>();
    NpyArray ref = read_npy(dir + "/golden/" + c["logits"].get<std::string>());
    ASSERT_EQ(ref.shape.size(), 2u);
    ASSERT_EQ(ref.shape[0], static_cast<int64_t>(prompt.size()));
    std::vector<float> logits(prompt.size() * V);
    be.reset();
    be.forward(prompt, logits.data(), true);
    Worst w = compare(logits, ref.as_float());
    std::printf("%s T=%zu worst relative error %.3g\n", layout.c_str(), prompt.size(), w.rel);
    EXPECT_LT(w.rel, 1e-4) << layout << " T=" << prompt.size() << ": worst at token " << w.at / V << " id "
                           << w.at % V << ": " << logits[w.at] << " vs " << ref.as_float()[w.at];
    // Greedy continuation.
    std::vector<int32_t> expect = c["greedy"].get<std::vector<int32_t>>();
    std::vector<float> last(logits.end() - V, logits.end());
    for (size_t s = 0; s < expect.size(); ++s) {
      const int32_t tok = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      ASSERT_EQ(tok, expect[s]) << layout << " T=" << prompt.size() << " step " << s;
      be.forward(std::span<const int32_t>(&tok, 1), last.data(), false);
    }
  }
}

}  // namespace

TEST(ForwardCpu, MatchesTransformersHfLayout) { check_golden("hf"); }
TEST(ForwardCpu, MatchesTransformersMlxLayout) { check_golden("mlx"); }

namespace {

// A tiny synthetic checkpoint written once per layout for this test binary.
const Model& synth_model(CheckpointLayout layout) {
  static std::map<int, std::unique_ptr<Model>> cache;
  auto& slot = cache[static_cast<int>(layout)];
  if (!slot) {
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("lily_test_forward_cpu_" + std::to_string(::getpid()) + "_" +
                              std::to_string(static_cast<int>(layout))))
                                .string();
    SynthOptions opt;
    opt.layout = layout;
    opt.seed = 7;
    opt.threads = 2;
    synth_checkpoint(dir, opt);
    slot = std::make_unique<Model>(load_model(dir));
    std::filesystem::remove_all(dir);
  }
  return *slot;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

void check_prefill_equals_decode(CheckpointLayout layout) {
  const Model& model = synth_model(layout);
  const int V = model.config.vocab;
  ThreadPool pool(2);
  // Longer than one prompt chunk, so the chunk boundary is crossed.
  const int T = CpuForward::kPromptChunk + 13;
  std::vector<int32_t> tokens = random_tokens(T, V, 3);
  CpuForward a(model, 0, &pool), b(model, 0, &pool);
  std::vector<float> all(static_cast<size_t>(T) * V), one(V);
  a.forward(tokens, all.data(), true);
  EXPECT_EQ(a.position(), T);
  double worst = 0;
  int worst_t = -1;
  for (int t = 0; t < T; ++t) {
    b.forward(std::span<const int32_t>(&tokens[t], 1), one.data(), false);
    double scale = 0, err = 0;
    for (int v = 0; v < V; ++v) {
      scale = std::max(scale, std::fabs(static_cast<double>(one[v])));
      err = std::max(err, std::fabs(static_cast<double>(one[v]) - all[static_cast<size_t>(t) * V + v]));
    }
    if (err / scale > worst) worst = err / scale, worst_t = t;
  }
  EXPECT_LE(worst, 1e-5) << "worst at token " << worst_t;
  // Uneven pieces and last-only logits give the same last row.
  CpuForward c(model, 0, &pool);
  std::vector<float> last(V);
  c.forward(std::span<const int32_t>(tokens.data(), 3), nullptr, false);
  c.forward(std::span<const int32_t>(tokens.data() + 3, 1), last.data(), false);
  c.forward(std::span<const int32_t>(tokens.data() + 4, T - 4), last.data(), false);
  double err = 0;
  for (int v = 0; v < V; ++v)
    err = std::max(err, std::fabs(static_cast<double>(last[v]) - all[static_cast<size_t>(T - 1) * V + v]));
  EXPECT_LE(err, 1e-5);
}

}  // namespace

TEST(ForwardCpu, PrefillEqualsDecodeHf) { check_prefill_equals_decode(CheckpointLayout::hf_bf16); }
TEST(ForwardCpu, PrefillEqualsDecodeMlx) { check_prefill_equals_decode(CheckpointLayout::mlx_affine); }

TEST(ForwardCpu, SaveRestoreRoundTrip) {
  for (CheckpointLayout layout : {CheckpointLayout::hf_bf16, CheckpointLayout::mlx_affine}) {
    const Model& model = synth_model(layout);
    const int V = model.config.vocab;
    ThreadPool pool(2);
    CpuForward be(model, 0, &pool);
    std::vector<int32_t> a = random_tokens(20, V, 11), b = random_tokens(7, V, 12), c = random_tokens(5, V, 13);
    be.forward(a, nullptr, false);
    const std::vector<uint8_t> snap = be.save_state();
    std::vector<float> lb1(7 * V), lb2(7 * V), lc(V);
    be.forward(b, lb1.data(), true);
    be.forward(c, lc.data(), false);  // move further on, then roll back
    be.restore_state(20, snap);
    EXPECT_EQ(be.position(), 20);
    be.forward(b, lb2.data(), true);
    EXPECT_EQ(lb1, lb2);
    // A fresh backend fed a + b gives the same logits for b.
    CpuForward fresh(model, 0, &pool);
    std::vector<float> lab(27 * V);
    std::vector<int32_t> ab = a;
    ab.insert(ab.end(), b.begin(), b.end());
    fresh.forward(ab, lab.data(), true);
    EXPECT_TRUE(std::equal(lb2.begin(), lb2.end(), lab.begin() + 20 * V));
    // Malformed snapshots are rejected.
    std::vector<uint8_t> bad = snap;
    bad.pop_back();
    EXPECT_THROW(be.restore_state(20, bad), Error);
    EXPECT_THROW(be.restore_state(be.position() + 1, snap), Error);
  }
}

TEST(ForwardCpu, RejectsBadTokensAndContextOverflow) {
  const Model& model = synth_model(CheckpointLayout::hf_bf16);
  ThreadPool pool(1);
  CpuForward be(model, 8, &pool);
  const int32_t bad = model.config.vocab;
  EXPECT_THROW(be.forward(std::span<const int32_t>(&bad, 1), nullptr, false), Error);
  const int32_t mixed[3] = {1, 2, -1};  // rejected before any token is consumed
  EXPECT_THROW(be.forward(mixed, nullptr, false), Error);
  EXPECT_EQ(be.position(), 0);
  std::vector<int32_t> nine(9, 1);
  EXPECT_THROW(be.forward(nine, nullptr, false), Error);
  EXPECT_EQ(be.max_context(), 8);
}

TEST(ForwardCpu, GlobalPoolMayBeResizedBetweenCalls) {
  const Model& model = synth_model(CheckpointLayout::mlx_affine);
  const int V = model.config.vocab;
  std::vector<int32_t> a = random_tokens(9, V, 21), b = random_tokens(4, V, 22);
  ThreadPool::set_global_threads(2);
  CpuForward global_be(model);  // global pool
  global_be.forward(a, nullptr, false);
  ThreadPool::set_global_threads(1);
  std::vector<float> l1(V), l2(V);
  global_be.forward(b, l1.data(), false);
  ThreadPool pool(3);
  CpuForward own(model, 0, &pool);
  own.forward(a, nullptr, false);
  own.forward(b, l2.data(), false);
  EXPECT_EQ(l1, l2);  // thread count does not change a single bit
}
