// The scheduler on a scripted batch backend whose "recurrent state" is a hash of every consumed token and whose
// logits are a function of it: a wrong restore, a crossed slot or a lost token changes every later id. Each
// concurrent run is compared with the same sequences run one at a time: admission, chunked prefill mixed with
// decode, preemption, cancellation, prefix reuse across slots and the turn tail must not change any output.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "runtime/scheduler.h"

using namespace lily;

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 31);
}

class HashBackend : public BatchBackend {
 public:
  HashBackend(int slots, int max_ctx) : slots_(slots), max_ctx_(max_ctx) { cfg_.vocab = 64; }
  const Config& config() const override { return cfg_; }
  std::string name() const override { return "hash"; }
  int max_seqs() const override { return static_cast<int>(slots_.size()); }
  int max_context() const override { return max_ctx_; }
  int position(int slot) const override { return static_cast<int>(slots_.at(slot).kv.size()); }
  void reset(int slot) override { slots_.at(slot) = {}; }
  bool draws(const SamplingParams&) const override { return draws_ids; }
  int prompt_grid() const override { return grid; }
  void step(std::span<const BatchEntry> batch) override {
    std::vector<int> seen;
    for (const BatchEntry& e : batch) {
      LILY_CHECK(std::find(seen.begin(), seen.end(), e.slot) == seen.end(), "duplicate slot");
      seen.push_back(e.slot);
      LILY_CHECK(!e.tokens.empty() && position(e.slot) + static_cast<int>(e.tokens.size()) <= max_ctx_, "overflow");
    }
    steps++;
    max_batch = std::max(max_batch, static_cast<int>(batch.size()));
    for (const BatchEntry& e : batch) {
      State& s = slots_[e.slot];
      if (e.tokens.size() > 1) piece_ends.push_back(static_cast<int>(s.kv.size() + e.tokens.size()));
      for (int32_t t : e.tokens) {
        s.kv.push_back(t);
        s.h = mix(s.h, static_cast<uint64_t>(t));
      }
      uint64_t check = 0;  // the state must be the hash of exactly the KV it sits on
      for (int32_t t : s.kv) check = mix(check, static_cast<uint64_t>(t));
      if (e.sampler) {  // the backend draws: on a copy of the sampler, then recorded as the contract says
        LILY_CHECK(draws_ids && e.drawn && e.key != 0 && !e.logits, "a draw the backend did not offer");
        std::vector<float> logits(cfg_.vocab);
        for (int j = 0; j < cfg_.vocab; ++j)
          logits[j] = check == s.h ? static_cast<float>(mix(s.h, 1000 + j) % 997) / 100.0f : NAN;
        Sampler probe = *e.sampler;
        try {
          *e.drawn = probe.sample(logits.data());
          e.sampler->record_drawn(e.drawn->token);
        } catch (const NanLogitsError&) {
          e.drawn->token = -1;
        }
        drawn_by_backend++;
        continue;
      }
      if (!e.logits) continue;
      for (int j = 0; j < cfg_.vocab; ++j)
        e.logits[j] = check == s.h ? static_cast<float>(mix(s.h, 1000 + j) % 997) / 100.0f : NAN;
    }
  }
  StateSnapshot save_state(int slot) const override {
    StateSnapshot s;
    s.position = position(slot);
    s.bytes.resize(8);
    std::memcpy(s.bytes.data(), &slots_.at(slot).h, 8);
    return s;
  }
  void restore_state(int slot, const StateSnapshot& snap) override {
    State& s = slots_.at(slot);
    LILY_CHECK(snap.position <= position(slot), "restore beyond the KV");
    s.kv.resize(snap.position);
    std::memcpy(&s.h, snap.bytes.data(), 8);
  }
  void copy_prefix(int dst, int src, int n) override {
    LILY_CHECK(dst != src && n <= position(src), "bad copy_prefix");
    slots_.at(dst).kv.assign(slots_[src].kv.begin(), slots_[src].kv.begin() + n);
    slots_[dst].h = 0xdeadbeef;  // undefined until restore_state
  }
  int steps = 0, max_batch = 0, drawn_by_backend = 0;
  bool draws_ids = false;  // draws() says yes: step() draws the ids itself
  int grid = 1;            // prompt_grid()
  std::vector<int> piece_ends;  // the position after each entry of more than one token

 private:
  struct State {
    std::vector<int32_t> kv;
    uint64_t h = 0;
  };
  Config cfg_;
  std::vector<State> slots_;
  int max_ctx_;
};

struct Outcome {
  std::vector<int32_t> ids;
  SeqResult result;
  bool done = false;
};

SeqSpec spec_of(std::vector<int32_t> prompt, int max_tokens, uint64_t seed, Outcome& out) {
  SeqSpec s;
  s.prompt = std::move(prompt);
  s.max_tokens = max_tokens;
  s.stop_ids = {63};
  s.sampling.params.temperature = 0.9f;
  s.sampling.params.seed = seed;
  s.sampling.params.repetition_penalty = 1.1f;
  s.on_token = [&out](const SampledToken& t, int, bool) {
    out.ids.push_back(t.token);
    return FinishReason::none;
  };
  s.on_done = [&out](const SeqResult& r) {
    EXPECT_FALSE(out.done) << "on_done twice";
    out.done = true;
    out.result = r;
  };
  return s;
}

void run_to_idle(Scheduler& s, int max_steps = 100000) {
  for (int i = 0; i < max_steps && !s.idle(); ++i) s.step();
  ASSERT_TRUE(s.idle()) << "the scheduler did not drain";
}

// The same spec alone in a one-slot scheduler with room for everything.
std::vector<int32_t> solo(std::vector<int32_t> prompt, int max_tokens, uint64_t seed, bool stops = true) {
  HashBackend be(1, 4096);
  SchedulerOptions o;
  o.prefix_cache = false;
  Scheduler sch(be, o);
  Outcome out;
  SeqSpec s = spec_of(std::move(prompt), max_tokens, seed, out);
  if (!stops) s.stop_ids.clear();
  sch.add(std::move(s));
  run_to_idle(sch);
  EXPECT_TRUE(out.done);
  return out.ids;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int n, const std::vector<int32_t>& prefix = {}) {
  std::vector<int32_t> p = prefix;
  while (static_cast<int>(p.size()) < n) p.push_back(static_cast<int32_t>(rng() % 62));
  return p;
}

void expect_empty(const Scheduler& s) {
  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.slots_used, 0);
}

}  // namespace

TEST(Scheduler, ConcurrentSequencesMatchTheirSoloRuns) {
  std::mt19937 rng(7);
  HashBackend be(4, 4096);
  SchedulerOptions o;
  o.prefill_chunk = 16;
  o.max_step_tokens = 24;
  o.kv_page_tokens = 8;
  Scheduler sch(be, o);
  const std::vector<int32_t> shared = random_prompt(rng, 30);
  struct Case {
    std::vector<int32_t> prompt;
    int max_tokens;
    uint64_t seed;
  };
  std::vector<Case> cases;
  for (int i = 0; i < 12; ++i)
    cases.push_back({random_prompt(rng, 5 + static_cast<int>(rng() % 60), i % 3 == 0 ? shared : std::vector<int32_t>{}),
                     1 + static_cast<int>(rng() % 40), 100 + static_cast<uint64_t>(i)});
  std::vector<Outcome> out(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    sch.add(spec_of(cases[i].prompt, cases[i].max_tokens, cases[i].seed, out[i]));
    sch.step();  // arrivals spread over the steps
  }
  run_to_idle(sch);
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(out[i].done) << i;
    EXPECT_NE(out[i].result.finish, FinishReason::error) << i << ": " << out[i].result.error;
    EXPECT_EQ(out[i].ids, solo(cases[i].prompt, cases[i].max_tokens, cases[i].seed)) << "sequence " << i;
  }
  EXPECT_EQ(be.max_batch, 4);
  expect_empty(sch);
}

// A backend that draws the ids itself (BatchEntry::sampler, as the CUDA batch backend on the device) gives each
// sequence the ids the scheduler's own draws give it alone, also through preemption (a small KV pool).
TEST(Scheduler, IdsDrawnByTheBackendMatchTheSchedulersDraws) {
  std::mt19937 rng(9);
  HashBackend be(3, 4096);
  be.draws_ids = true;
  SchedulerOptions o;
  o.prefill_chunk = 16;
  o.kv_page_tokens = 8;
  o.kv_pages = 24;  // 192 tokens for three sequences of up to ~100: some are preempted and recomputed
  Scheduler sch(be, o);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_tokens;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(random_prompt(rng, 5 + static_cast<int>(rng() % 40)));
    max_tokens.push_back(10 + static_cast<int>(rng() % 50));
  }
  std::vector<Outcome> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) sch.add(spec_of(prompts[i], max_tokens[i], 300 + i, out[i]));
  run_to_idle(sch);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(out[i].done) << i;
    EXPECT_NE(out[i].result.finish, FinishReason::error) << i << ": " << out[i].result.error;
    EXPECT_EQ(out[i].ids, solo(prompts[i], max_tokens[i], 300 + i)) << "sequence " << i;
  }
  EXPECT_GT(be.drawn_by_backend, 0);
  EXPECT_GT(sch.stats().preemptions, 0) << "the case meant to preempt did not";
  expect_empty(sch);
}

TEST(Scheduler, PromptPiecesDoNotStallRunningStreams) {
  std::mt19937 rng(3);
  HashBackend be(2, 4096);
  SchedulerOptions o;
  o.prefill_chunk = 8;
  o.max_step_tokens = 9;
  Scheduler sch(be, o);
  Outcome a, b;
  sch.add(spec_of(random_prompt(rng, 4), 40, 1, a));
  sch.step();
  const size_t before = a.ids.size();
  sch.add(spec_of(random_prompt(rng, 200), 3, 2, b));  // 25 pieces of 8
  int steps = 0;
  while (!b.done || !a.done) {
    const size_t had = a.ids.size();
    sch.step();
    ++steps;
    if (!a.done && steps < 25) EXPECT_EQ(a.ids.size(), had + 1) << "the running stream waited at step " << steps;
  }
  EXPECT_GT(a.ids.size(), before + 20);
  expect_empty(sch);
}

// Steps of 512 tokens at most, 100 while a sequence decodes (so a prompt piece beside one decode row gets 99).
SchedulerOptions budget_options() {
  SchedulerOptions o;
  o.prefill_chunk = 512;
  o.max_step_tokens = 512;
  o.decode_step_tokens = 100;
  return o;
}
// a (seed 1, a_max ids) starts decoding, then b's prompt (seed 2, 3 ids) goes in beside it; both run to the end.
void decode_beside_prompt(Scheduler& sch, const std::vector<int32_t>& pa, int a_max, Outcome& a,
                          const std::vector<int32_t>& pb, Outcome& b) {
  sch.add(spec_of(pa, a_max, 1, a));
  sch.step();  // a's prompt
  sch.add(spec_of(pb, 3, 2, b));
  run_to_idle(sch);
}

// decode_step_tokens caps a step while a sequence decodes (the stream's gap), the full max_step_tokens when none
// does; the outputs are those of solo runs.
TEST(Scheduler, StepsWhileDecodingKeepToTheirBudget) {
  std::mt19937 rng(4);
  HashBackend be(2, 4096);
  Scheduler sch(be, budget_options());
  std::vector<std::pair<int, int>> steps;  // (sequences, tokens)
  sch.on_step = [&](int n, int t) { steps.push_back({n, t}); };
  Outcome a, b;
  const auto pa = random_prompt(rng, 10), pb = random_prompt(rng, 1000);
  decode_beside_prompt(sch, pa, 30, a, pb, b);
  int capped = 0;
  for (size_t i = 1; i < steps.size(); ++i) {
    EXPECT_LE(steps[i].second, 100) << "step " << i << " while a decodes";
    capped += steps[i].first == 2;
  }
  EXPECT_GE(capped, 10) << "b's prompt (1000 tokens) should have taken ~11 steps of 99 next to a";
  EXPECT_EQ(a.ids, solo(pa, 30, 1));
  EXPECT_EQ(b.ids, solo(pb, 3, 2));
  // alone, a prompt takes the whole budget
  steps.clear();
  Outcome c;
  sch.add(spec_of(random_prompt(rng, 1000), 2, 3, c));
  run_to_idle(sch);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0].second, 512);
  expect_empty(sch);
}

TEST(Scheduler, PreemptedSequencesResumeWithTheSameOutput) {
  std::mt19937 rng(11);
  HashBackend be(4, 4096);
  SchedulerOptions o;
  o.kv_page_tokens = 4;
  o.kv_pages = 40;  // 160 tokens for four sequences that want ~90 each
  o.prefix_cache = false;
  Scheduler sch(be, o);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Outcome> out(4);
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(random_prompt(rng, 10 + i));
    SeqSpec s = spec_of(prompts.back(), 80, 50 + i, out[i]);
    s.stop_ids.clear();
    sch.add(std::move(s));
  }
  run_to_idle(sch);
  EXPECT_GT(sch.stats().preemptions, 0);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(out[i].done);
    EXPECT_EQ(out[i].result.finish, FinishReason::length);
    EXPECT_EQ(out[i].ids.size(), 80u);
    EXPECT_EQ(out[i].ids, solo(prompts[i], 80, 50 + i, false)) << "sequence " << i << " after " << out[i].result.preemptions << " preemptions";
  }
  expect_empty(sch);
  EXPECT_LE(sch.stats().kv_pages_used, o.kv_pages);
}

TEST(Scheduler, CancellationsEndOnlyTheirOwnSequence) {
  std::mt19937 rng(5);
  HashBackend be(3, 4096);
  Scheduler sch(be, {});
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Outcome> out(9);
  std::vector<int> cancel_at = {3, -1, 0, -1, 10, -1, 1, -1, -1};  // after k ids (0: while waiting or prefilling)
  for (int i = 0; i < 9; ++i) {
    prompts.push_back(random_prompt(rng, 6 + i * 3));
    SeqSpec s = spec_of(prompts.back(), 30, 9 + i, out[i]);
    s.stop_ids.clear();
    const int k = cancel_at[i];
    Outcome* o = &out[i];
    if (k >= 0) s.interrupt = [o, k] { return static_cast<int>(o->ids.size()) >= k ? FinishReason::cancelled : FinishReason::none; };
    sch.add(std::move(s));
  }
  run_to_idle(sch);
  for (int i = 0; i < 9; ++i) {
    ASSERT_TRUE(out[i].done);
    std::vector<int32_t> ref = solo(prompts[i], 30, 9 + i, false);
    if (cancel_at[i] < 0) {
      EXPECT_EQ(out[i].result.finish, FinishReason::length) << i;
      EXPECT_EQ(out[i].ids, ref) << i;
    } else {
      EXPECT_EQ(out[i].result.finish, FinishReason::cancelled) << i;
      EXPECT_EQ(static_cast<int>(out[i].ids.size()), cancel_at[i]) << i;
      ref.resize(out[i].ids.size());
      EXPECT_EQ(out[i].ids, ref) << i;
    }
  }
  expect_empty(sch);
}

TEST(Scheduler, ASharedPrefixIsProcessedOnceAcrossSlots) {
  std::mt19937 rng(21);
  HashBackend be(3, 4096);
  SchedulerOptions o;
  o.prefill_chunk = 16;
  Scheduler sch(be, o);
  const std::vector<int32_t> system = random_prompt(rng, 40);
  Outcome a, b, c;
  SeqSpec sa = spec_of(random_prompt(rng, 50, system), 30, 1, a);
  sa.checkpoints = {40};
  sa.stop_ids.clear();
  sch.add(std::move(sa));
  for (int i = 0; i < 5; ++i) sch.step();  // a has passed its checkpoint and decodes
  ASSERT_FALSE(a.done);
  std::vector<int32_t> pb = random_prompt(rng, 47, system), pc = random_prompt(rng, 60, system);
  int cached_b = -1, cached_c = -1;
  SeqSpec sb = spec_of(pb, 5, 2, b), sc = spec_of(pc, 5, 3, c);
  sb.on_admitted = [&](int n) { cached_b = n; };
  sc.on_admitted = [&](int n) { cached_c = n; };
  sch.add(std::move(sb));
  sch.add(std::move(sc));
  run_to_idle(sch);
  EXPECT_EQ(cached_b, 40);  // copied from a's slot while a runs
  EXPECT_EQ(cached_c, 40);
  EXPECT_EQ(b.ids, solo(pb, 5, 2));
  EXPECT_EQ(c.ids, solo(pc, 5, 3));
  EXPECT_EQ(sch.stats().cached_tokens, 80);
  expect_empty(sch);
}

// A backend whose prompt path works in pieces at multiples of 16 (as the CUDA chunked GDN's 64) gets its prompt
// checkpoints there: a requested one (100 -> 96), the interval's (50 -> 48), and a shared prefix's that a
// waiting sequence asks of a running one (100 -> 96); the outputs stay the solo runs'.
TEST(Scheduler, PromptCheckpointsKeepToTheBackendsGrid) {
  std::mt19937 rng(23);
  const std::vector<int32_t> system = random_prompt(rng, 100);
  auto with = [&](int32_t first, int n) {
    std::vector<int32_t> p = system;
    p.push_back(first);
    return random_prompt(rng, n, p);
  };
  auto options = [](int chunk, int interval) {
    SchedulerOptions o;
    o.prefill_chunk = chunk;
    o.checkpoint_interval = interval;
    return o;
  };
  // b joins the scheduler and runs to the end: how many of its tokens came from the cache
  auto cached_of = [](Scheduler& sch, const std::vector<int32_t>& pb, Outcome& b) {
    int cached = -1;
    SeqSpec sb = spec_of(pb, 5, 2, b);
    sb.on_admitted = [&](int n) { cached = n; };
    sch.add(std::move(sb));
    run_to_idle(sch);
    return cached;
  };
  {
    HashBackend be(3, 4096);
    be.grid = 16;
    Scheduler sch(be, options(16, 50));
    Outcome a, b;
    SeqSpec sa = spec_of(with(60, 130), 30, 1, a);
    sa.checkpoints = {100};
    sa.stop_ids.clear();
    sch.add(std::move(sa));
    for (int i = 0; i < 12; ++i) sch.step();  // a's prompt is in the cache at 48 and 96
    ASSERT_FALSE(a.done);
    EXPECT_EQ(sch.stats().cache_entries, 2u);
    const std::vector<int32_t> pb = with(61, 107);
    EXPECT_EQ(cached_of(sch, pb, b), 96);
    EXPECT_EQ(b.ids, solo(pb, 5, 2));
    expect_empty(sch);
  }
  {  // b arrives while a still consumes its prompt: a gets a cut where the shared part ends, on the grid
    HashBackend be(2, 4096);
    be.grid = 16;
    Scheduler sch(be, options(8, 0));
    Outcome a, b;
    const std::vector<int32_t> pa = with(60, 300), pb = with(61, 110);
    sch.add(spec_of(pa, 5, 1, a));
    sch.step();
    EXPECT_EQ(cached_of(sch, pb, b), 96);
    EXPECT_EQ(a.ids, solo(pa, 5, 1));
    EXPECT_EQ(b.ids, solo(pb, 5, 2));
    expect_empty(sch);
  }
}

// Next to a decoding sequence a step leaves a prompt 99 tokens (decode_step_tokens 100): with a prompt grid of
// 16 each piece still ends on the grid (96 tokens), or at the prompt's end, and the output stays the solo run's.
TEST(Scheduler, PromptPiecesEndOnTheBackendsGrid) {
  std::mt19937 rng(29);
  HashBackend be(2, 4096);
  be.grid = 16;
  Scheduler sch(be, budget_options());
  Outcome a, b;
  const auto pa = random_prompt(rng, 10), pb = random_prompt(rng, 1000);
  decode_beside_prompt(sch, pa, 40, a, pb, b);
  int beside = 0;  // pieces of b's prompt cut by the budget next to a
  for (int end : be.piece_ends) {
    EXPECT_TRUE(end % 16 == 0 || end == 10 || end == 1000) << "a prompt piece ended at " << end;
    beside += end % 96 == 0 && end < 1000;
  }
  EXPECT_GE(beside, 5) << "b's pieces next to a should have been 96 tokens";
  EXPECT_EQ(a.ids, solo(pa, 40, 1));
  EXPECT_EQ(b.ids, solo(pb, 3, 2));
  expect_empty(sch);
}

TEST(Scheduler, TheNextTurnContinuesFromTheTurnTail) {
  std::mt19937 rng(2);
  HashBackend be(2, 4096);
  Scheduler sch(be, {});
  const std::vector<int32_t> prompt = random_prompt(rng, 20);
  // Find a seed whose run stops on the stop id within 200 ids.
  uint64_t seed = 0;
  std::vector<int32_t> first;
  for (; seed < 50; ++seed) {
    first = solo(prompt, 200, seed);
    if (!first.empty() && first.back() == 63 && first.size() < 200) break;
  }
  ASSERT_EQ(first.back(), 63);
  Outcome a;
  SeqSpec sa = spec_of(prompt, 200, seed, a);
  sa.turn_tail = {63, 7, 8};
  sch.add(std::move(sa));
  run_to_idle(sch);
  ASSERT_EQ(a.ids, first);
  EXPECT_TRUE(a.result.stopped_by_id);
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), first.begin(), first.end());
  next.insert(next.end(), {7, 8, 9, 10});
  Outcome b;
  int cached = -1;
  SeqSpec sb = spec_of(next, 6, 77, b);
  sb.on_admitted = [&](int n) { cached = n; };
  sch.add(std::move(sb));
  run_to_idle(sch);
  EXPECT_EQ(cached, static_cast<int>(next.size()) - 2);  // everything up to the tail
  EXPECT_EQ(b.ids, solo(next, 6, 77));
}

TEST(Scheduler, RejectsWhatCanNeverRun) {
  HashBackend be(2, 100);
  SchedulerOptions o;
  o.kv_page_tokens = 10;
  o.kv_pages = 5;
  Scheduler sch(be, o);
  Outcome x;
  EXPECT_THROW(sch.add(spec_of(std::vector<int32_t>(100, 1), 4, 0, x)), Error);  // beyond the context
  EXPECT_THROW(sch.add(spec_of(std::vector<int32_t>(60, 1), 4, 0, x)), Error);   // beyond the KV pool
  EXPECT_THROW(sch.add(spec_of({}, 4, 0, x)), Error);
  EXPECT_THROW(sch.add(spec_of({1, 2}, 0, 0, x)), Error);
  EXPECT_THROW(sch.add(spec_of({1, 64}, 4, 0, x)), Error);
  // A lone sequence that outgrows the pool ends with length, keeping what it generated.
  Outcome y;
  SeqSpec s = spec_of(std::vector<int32_t>(40, 1), 90, 0, y);
  s.stop_ids.clear();
  sch.add(std::move(s));
  run_to_idle(sch);
  ASSERT_TRUE(y.done);
  EXPECT_EQ(y.result.finish, FinishReason::length);
  EXPECT_EQ(y.ids.size(), 11u);  // 40 + 10 consumed fill the 50-token pool; the 11th id has no room
  EXPECT_EQ(y.ids, solo(std::vector<int32_t>(40, 1), 11, 0, false));
  expect_empty(sch);
}

TEST(Scheduler, SamplesOfOnePromptComputeItOnce) {
  std::mt19937 rng(8);
  HashBackend be(4, 4096);
  SchedulerOptions o;
  o.prefill_chunk = 16;
  Scheduler sch(be, o);
  const std::vector<int32_t> prompt = random_prompt(rng, 50);
  std::vector<Outcome> out(4);
  std::vector<int> cached(4, -1);
  for (int i = 0; i < 4; ++i) {  // n = 4: arrive together, seeds differ
    SeqSpec s = spec_of(prompt, 12, 40 + i, out[i]);
    s.on_admitted = [&cached, i](int n) { cached[i] = n; };
    sch.add(std::move(s));
  }
  run_to_idle(sch);
  EXPECT_EQ(cached, (std::vector<int>{0, 49, 49, 49}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i].ids, solo(prompt, 12, 40 + i)) << i;
  // A different prompt with a short common head does not wait for it.
  Outcome a, b;
  int cached_b = -1;
  std::vector<int32_t> pa = random_prompt(rng, 40), pb = pa;
  pb.resize(10);
  pb = random_prompt(rng, 30, pb);
  sch.add(spec_of(pa, 3, 1, a));
  SeqSpec sb = spec_of(pb, 3, 2, b);
  sb.on_admitted = [&](int n) { cached_b = n; };
  sch.add(std::move(sb));
  sch.step();
  EXPECT_EQ(cached_b, 0);
  run_to_idle(sch);
  expect_empty(sch);
}

namespace {
// Marks the time between step_begin and step_end (the pass in flight).
class OpenFlag : public ForwardingBatchBackend {
 public:
  using ForwardingBatchBackend::ForwardingBatchBackend;
  void step_begin(std::span<const BatchEntry> batch) override {
    inner_.step_begin(batch);
    open = true;
  }
  void step_end() override {
    open = false;
    inner_.step_end();
  }
  bool open = false;
};
}  // namespace

// The ids a step drew are reported while the next step's pass runs (the host's streaming work overlaps the
// device); only ids after which no pass is left to run are reported outside one. Outputs are unchanged.
TEST(Scheduler, IdsAreReportedWhileTheNextPassRuns) {
  std::mt19937 rng(31);
  HashBackend hash(2, 4096);
  hash.draws_ids = true;
  OpenFlag be(hash);
  Scheduler sch(be, {});
  std::vector<std::vector<int32_t>> prompts = {random_prompt(rng, 9), random_prompt(rng, 14)};
  std::vector<Outcome> out(2);
  int reports = 0, during_pass = 0;
  for (int i = 0; i < 2; ++i) {
    SeqSpec s = spec_of(prompts[i], 20 + 7 * i, 40 + i, out[i]);
    s.stop_ids.clear();
    Outcome* o = &out[i];
    s.on_token = [&, o](const SampledToken& t, int, bool) {
      o->ids.push_back(t.token);
      ++reports;
      during_pass += be.open ? 1 : 0;
      return FinishReason::none;
    };
    sch.add(std::move(s));
  }
  run_to_idle(sch);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(out[i].ids, solo(prompts[i], 20 + 7 * i, 40 + i, false)) << i;
  EXPECT_EQ(reports, 47);
  EXPECT_EQ(during_pass, 47 - 1) << "only the very last id has no pass left to overlap";
  expect_empty(sch);
}

// A sequence that its on_token ends (a stop string, a client gone) has already gone into the next pass with
// that id: the pass still ends, its slot records the id it consumed, and a follow-up request that extends the
// conversation continues from there with the same ids as from scratch.
TEST(Scheduler, ASequenceEndedWhileItsNextPassRunsKeepsItsSlotExact) {
  std::mt19937 rng(33);
  HashBackend be(2, 4096);
  be.draws_ids = true;
  Scheduler sch(be, {});
  const std::vector<int32_t> prompt = random_prompt(rng, 12);
  Outcome a;
  SeqSpec sa = spec_of(prompt, 30, 5, a);
  sa.stop_ids.clear();
  sa.on_token = [&a](const SampledToken& t, int index, bool) {
    a.ids.push_back(t.token);
    return index == 6 ? FinishReason::stop : FinishReason::none;
  };
  sch.add(std::move(sa));
  run_to_idle(sch);
  ASSERT_TRUE(a.done);
  EXPECT_EQ(a.result.finish, FinishReason::stop);
  EXPECT_FALSE(a.result.stopped_by_id);
  std::vector<int32_t> ref = solo(prompt, 30, 5, false);
  ref.resize(7);
  EXPECT_EQ(a.ids, ref);
  expect_empty(sch);

  std::vector<int32_t> next = prompt;
  next.insert(next.end(), a.ids.begin(), a.ids.end());
  next.insert(next.end(), {3, 1, 4});
  Outcome b;
  SeqSpec sb = spec_of(next, 12, 6, b);
  sb.stop_ids.clear();
  sch.add(std::move(sb));
  run_to_idle(sch);
  EXPECT_EQ(b.result.n_cached, static_cast<int>(prompt.size()) + 7) << "the slot holds every id a consumed";
  EXPECT_EQ(b.ids, solo(next, 12, 6, false));
  expect_empty(sch);
}
