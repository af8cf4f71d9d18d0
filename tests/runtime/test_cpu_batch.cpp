// CpuBatchBackend on the tiny golden checkpoint (both layouts): sequences stepped together (prompt pieces and
// decode tokens mixed, slots joining and leaving) give logits bit-identical to each sequence run alone through
// CpuForward; copy_prefix + restore_state continue a sequence exactly; invalid steps throw before any slot
// changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "model/forward_cpu.h"
#include "runtime/bench_concurrency.h"
#include "runtime/cpu_batch_backend.h"
#include "util/check.h"

using namespace lily;

namespace {

// layout: "hf" (bf16) or "mlx" (affine 4/8-bit), the same tiny model.
const Model& golden_model(const std::string& layout = "hf") {
  static Model hf = load_model(std::string(LILY_SOURCE_DIR) + "/tests/data/golden/hf");
  static Model mlx = load_model(std::string(LILY_SOURCE_DIR) + "/tests/data/golden/mlx");
  return layout == "mlx" ? mlx : hf;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One sequence of the mixed schedule: its tokens, the pieces they are fed in, and the step it joins at.
struct Script {
  std::vector<int32_t> tokens;
  std::vector<int> pieces;  // sizes summing to tokens.size(); a piece of 1 after the prompt is a decode step
  int join = 0;             // the step of its first piece
  int slot = 0;
};

// The logits after each piece, feeding the same pieces to one CpuForward.
std::vector<std::vector<float>> run_alone(const Model& model, const Script& s, ThreadPool& pool) {
  CpuForward f(model, 0, &pool);
  std::vector<std::vector<float>> out;
  size_t off = 0;
  for (int n : s.pieces) {
    out.emplace_back(model.config.vocab);
    f.forward(std::span<const int32_t>(s.tokens.data() + off, n), out.back().data(), false);
    off += n;
  }
  return out;
}

void check_mixed_steps(const Model& model) {
  const int V = model.config.vocab;
  ThreadPool pool(2);
  const int chunk = CpuBatchForward::kPromptChunk;
  // Prompt pieces (some longer than a pass chunk), then decode tokens; joins staggered so slots prefill while
  // others decode, and slot 1 is reused by a later sequence after its first one leaves.
  std::vector<Script> scripts = {
      {{}, {chunk + 37, 1, 1, 1, 1, 1}, 0, 0},
      {{}, {5, 3, 1, 1}, 0, 1},
      {{}, {1, 1, 9, 1, 1, 1, 1}, 1, 2},
      {{}, {2 * chunk + 5, 1, 1}, 2, 3},
      {{}, {17, 1, 1, 1, 1, 1, 1, 1}, 3, 4},
      {{}, {11, 1, 1}, 5, 1},  // joins slot 1 after the sequence there has finished
  };
  for (size_t i = 0; i < scripts.size(); ++i) {
    int total = 0;
    for (int n : scripts[i].pieces) total += n;
    scripts[i].tokens = random_tokens(total, V, 100 + i);
  }
  std::vector<std::vector<std::vector<float>>> alone;  // on one thread: the thread count does not matter either
  ThreadPool one(1);
  for (const Script& s : scripts) alone.push_back(run_alone(model, s, one));

  CpuBatchBackend be(model, 5, 0, &pool);
  EXPECT_EQ(be.max_seqs(), 5);
  EXPECT_EQ(be.name(), "cpu");
  std::vector<size_t> next(scripts.size(), 0), off(scripts.size(), 0);
  std::vector<std::vector<std::vector<float>>> got(scripts.size());
  int checked = 0;
  for (int step = 0;; ++step) {
    std::vector<BatchEntry> batch;
    std::vector<int> who;
    for (size_t i = 0; i < scripts.size(); ++i) {
      const Script& s = scripts[i];
      if (step < s.join || next[i] == s.pieces.size()) continue;
      if (next[i] == 0) {
        // slot 1's second sequence starts only after the first has left
        bool busy = false;
        for (size_t j = 0; j < i; ++j) busy |= scripts[j].slot == s.slot && next[j] < scripts[j].pieces.size();
        if (busy) continue;
        be.reset(s.slot);
      }
      const int n = s.pieces[next[i]];
      got[i].emplace_back(V);
      BatchEntry e{s.slot, std::span<const int32_t>(s.tokens.data() + off[i], n), got[i].back().data()};
      batch.push_back(e);
      who.push_back(static_cast<int>(i));
    }
    if (batch.empty()) break;
    if (step % 2) std::reverse(batch.begin(), batch.end());  // entry order does not matter
    if (step % 3 == 1) {  // the pass on the backend's thread: the same bits; no other call until it ends
      be.step_begin(batch);
      EXPECT_THROW(be.position(0), Error);
      EXPECT_THROW(be.step_begin(batch), Error);
      be.step_end();
      EXPECT_THROW(be.step_end(), Error);
    } else {
      be.step(batch);
    }
    for (int i : who) {
      off[i] += scripts[i].pieces[next[i]];
      EXPECT_EQ(be.position(scripts[i].slot), static_cast<int>(off[i]));
      EXPECT_TRUE(same_bits(got[i].back(), alone[i][next[i]])) << "sequence " << i << " piece " << next[i];
      ++next[i];
      ++checked;
    }
  }
  int pieces = 0;
  for (const Script& s : scripts) pieces += static_cast<int>(s.pieces.size());
  EXPECT_EQ(checked, pieces);
}

}  // namespace

TEST(CpuBatch, MixedStepsMatchSequencesRunAloneHf) { check_mixed_steps(golden_model("hf")); }
TEST(CpuBatch, MixedStepsMatchSequencesRunAloneMlx) { check_mixed_steps(golden_model("mlx")); }

// More prompt rows in one step than one pass takes: the step runs several passes, each group gets a row in
// each pass it has tokens left for.
TEST(CpuBatch, StepLongerThanOnePass) {
  const Model& model = golden_model();
  const int V = model.config.vocab;
  ThreadPool pool(2);
  const int n_seqs = CpuBatchForward::kPassRows / CpuBatchForward::kPromptChunk + 2;
  CpuBatchBackend be(model, n_seqs, 0, &pool);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> got(n_seqs, std::vector<float>(V));
  std::vector<BatchEntry> batch;
  for (int i = 0; i < n_seqs; ++i) prompts.push_back(random_tokens(CpuBatchForward::kPromptChunk + 3 * i + 1, V, 60 + i));
  for (int i = 0; i < n_seqs; ++i) batch.push_back({i, prompts[i], got[i].data()});
  be.step(batch);
  for (int i = 0; i < n_seqs; ++i) {
    CpuForward f(model, 0, &pool);
    std::vector<float> want(V);
    f.forward(prompts[i], want.data(), false);
    EXPECT_TRUE(same_bits(got[i], want)) << "sequence " << i;
    EXPECT_EQ(be.position(i), static_cast<int>(prompts[i].size()));
  }
}

TEST(CpuBatch, NullLogitsAndStepsOfOneSlot) {
  const Model& model = golden_model();
  const int V = model.config.vocab;
  ThreadPool pool(2);
  const std::vector<int32_t> t = random_tokens(40, V, 7);
  CpuForward f(model, 0, &pool);
  std::vector<float> want(V), got(V);
  f.forward(t, want.data(), false);
  CpuBatchBackend be(model, 3, 0, &pool);
  // A prompt in pieces without logits, in slot 2 while slot 0 decodes other tokens.
  const std::vector<int32_t> other = random_tokens(3, V, 8);
  std::vector<float> scratch(V);
  be.step(std::vector<BatchEntry>{{2, std::span<const int32_t>(t.data(), 13), nullptr},
                                  {0, std::span<const int32_t>(other.data(), 1), scratch.data()}});
  be.step(std::vector<BatchEntry>{{2, std::span<const int32_t>(t.data() + 13, 27), got.data()}});
  EXPECT_TRUE(same_bits(got, want));
  EXPECT_EQ(be.position(2), 40);
  EXPECT_EQ(be.position(0), 1);
  EXPECT_EQ(be.position(1), 0);
}

TEST(CpuBatch, CopyPrefixAndRestoreContinueExactly) {
  const Model& model = golden_model();
  const int V = model.config.vocab;
  ThreadPool pool(2);
  const std::vector<int32_t> prefix = random_tokens(23, V, 31), more = random_tokens(9, V, 32),
                             cont = random_tokens(6, V, 33);
  CpuBatchBackend be(model, 3, 0, &pool);
  std::vector<float> scratch(V);
  be.step(std::vector<BatchEntry>{{0, prefix, scratch.data()}});
  const StateSnapshot snap = be.save_state(0);
  EXPECT_EQ(snap.position, 23);
  be.step(std::vector<BatchEntry>{{0, more, scratch.data()}});  // the source moves on past the prefix

  // Slot 2 takes the prefix; slot 0 rolls back to it; both continue with the same tokens, in one step and
  // then token by token.
  be.copy_prefix(2, 0, 23);
  EXPECT_EQ(be.position(2), 23);
  be.restore_state(2, snap);
  be.restore_state(0, snap);
  EXPECT_EQ(be.position(0), 23);
  std::vector<float> a(V), b(V);
  be.step(std::vector<BatchEntry>{{0, std::span<const int32_t>(cont.data(), 2), a.data()},
                                  {2, std::span<const int32_t>(cont.data(), 2), b.data()}});
  EXPECT_TRUE(same_bits(a, b));
  for (int i = 2; i < 6; ++i) {
    be.step(std::vector<BatchEntry>{{2, std::span<const int32_t>(&cont[i], 1), b.data()},
                                    {0, std::span<const int32_t>(&cont[i], 1), a.data()}});
    EXPECT_TRUE(same_bits(a, b)) << "token " << i;
  }
  // And both match a sequence fed prefix + cont alone.
  CpuForward f(model, 0, &pool);
  std::vector<float> want(V);
  f.forward(prefix, nullptr, false);
  f.forward(cont, want.data(), false);
  EXPECT_TRUE(same_bits(a, want));

  // Snapshots use CpuForward's layout: one taken there restores here.
  CpuForward g(model, 0, &pool);
  g.forward(prefix, nullptr, false);
  StateSnapshot from_forward;
  from_forward.position = 23;
  from_forward.bytes = g.save_state();
  EXPECT_EQ(from_forward.bytes, snap.bytes);
  be.copy_prefix(1, 2, 23);
  be.restore_state(1, from_forward);
  be.step(std::vector<BatchEntry>{{1, cont, b.data()}});
  EXPECT_TRUE(same_bits(b, want));

  EXPECT_THROW(be.copy_prefix(1, 0, be.position(0) + 1), Error);
  EXPECT_THROW(be.copy_prefix(3, 0, 1), Error);
  EXPECT_THROW(be.restore_state(1, StateSnapshot{5, {1, 2, 3}, nullptr, 0}), Error);
}

TEST(CpuBatch, InvalidStepsChangeNothing) {
  const Model& model = golden_model();
  const int V = model.config.vocab;
  ThreadPool pool(1);
  CpuBatchBackend be(model, 3, 16, &pool);
  EXPECT_EQ(be.max_context(), 16);
  const std::vector<int32_t> five = random_tokens(5, V, 41), twelve = random_tokens(12, V, 42);
  be.step(std::vector<BatchEntry>{{0, five, nullptr}, {1, twelve, nullptr}});
  const std::vector<int32_t> bad = {1, V, 2}, neg = {-1};
  auto positions = [&] { return std::vector<int>{be.position(0), be.position(1), be.position(2)}; };
  const std::vector<int> before = positions();
  const StateSnapshot s0 = be.save_state(0);
  // duplicate slot
  EXPECT_THROW(be.step(std::vector<BatchEntry>{{0, five, nullptr}, {2, five, nullptr}, {0, five, nullptr}}), Error);
  // bad token id in a later entry
  EXPECT_THROW(be.step(std::vector<BatchEntry>{{0, five, nullptr}, {2, bad, nullptr}}), Error);
  EXPECT_THROW(be.step(std::vector<BatchEntry>{{2, five, nullptr}, {0, neg, nullptr}}), Error);
  // slot 1 would pass its context limit (12 + 5 > 16)
  EXPECT_THROW(be.step(std::vector<BatchEntry>{{0, five, nullptr}, {1, five, nullptr}}), Error);
  // slot out of range, empty entry
  EXPECT_THROW(be.step(std::vector<BatchEntry>{{0, five, nullptr}, {3, five, nullptr}}), Error);
  EXPECT_THROW(be.step(std::vector<BatchEntry>{{0, five, nullptr}, {-1, five, nullptr}}), Error);
  EXPECT_THROW(be.step(std::vector<BatchEntry>{{0, five, nullptr}, {2, {}, nullptr}}), Error);
  EXPECT_EQ(positions(), before);
  EXPECT_EQ(be.save_state(0).bytes, s0.bytes);
  // The error names the slot and the token.
  try {
    be.step(std::vector<BatchEntry>{{2, bad, nullptr}});
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("slot 2"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(V)), std::string::npos) << what;
  }
  // Exactly up to the limit is fine.
  be.step(std::vector<BatchEntry>{{1, std::span<const int32_t>(five.data(), 4), nullptr}});
  EXPECT_EQ(be.position(1), 16);
  EXPECT_THROW(be.position(3), Error);
  EXPECT_THROW(CpuBatchBackend(model, 0, 0, &pool), Error);
}

TEST(CpuBatch, ForwardRejectsRepeatedState) {
  const Model& model = golden_model();
  ThreadPool pool(1);
  CpuBatchForward f(model, &pool);
  CpuSequenceState s = f.new_state();
  const std::vector<int32_t> t = {1, 2};
  const CpuGroup g[2] = {{&s, t, nullptr, false}, {&s, t, nullptr, false}};
  EXPECT_THROW(f.forward(g), Error);
  EXPECT_EQ(s.position, 0);
}

namespace {
// Counts the steps between profile_begin and profile_end and returns them as one family's "ms".
class StepCountingProfile : public ForwardingBatchBackend {
 public:
  using ForwardingBatchBackend::ForwardingBatchBackend;
  bool profile_begin() override { return on_ = true, counted_ = 0, ++begun, true; }
  std::vector<FamilyTime> profile_end() override {
    on_ = false;
    FamilyTime f;
    f.name = "steps";
    f.ms = counted_;
    return {f};
  }
  void step_begin(std::span<const BatchEntry> batch) override {
    counted_ += on_ ? 1 : 0;
    inner_.step_begin(batch);
  }
  int begun = 0;

 private:
  bool on_ = false;
  int counted_ = 0;
};
}  // namespace

// `lily bench --concurrency --profile-steps N`: N steps from the middle of each run are profiled (fewer when the
// run ends first), none without the option.
TEST(CpuBatch, ConcurrencyBenchProfilesStepsFromTheMiddle) {
  CpuBatchBackend cpu(golden_model("mlx"), 2, 64);
  StepCountingProfile be(cpu);
  ConcurrencyBenchOptions o;
  o.concurrency = {2};
  o.prompt_tokens = 5;
  o.gen_tokens = 12;
  for (int n : {0, 3, 100}) {
    o.profile_steps = n;
    const std::vector<ConcurrencyPoint> pts = run_concurrency_bench(be, o);
    ASSERT_EQ(pts.size(), 1u);
    const ConcurrencyPoint& p = pts[0];
    if (n == 0) {
      EXPECT_TRUE(p.families.empty());
      EXPECT_EQ(p.profiled_steps, 0);
      continue;
    }
    ASSERT_EQ(p.families.size(), 1u);
    EXPECT_EQ(p.families[0].ms, p.profiled_steps);
    EXPECT_EQ(p.profiled_steps, std::min(n, p.steps - o.gen_tokens / 2)) << "profile_steps " << n;
  }
  EXPECT_EQ(be.begun, 2);
}
