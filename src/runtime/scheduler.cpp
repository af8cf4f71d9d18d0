// Continuous batching over a BatchBackend (see scheduler.h).
#include "runtime/scheduler.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "util/check.h"
#include "util/thread_pool.h"

namespace lily {

struct Scheduler::Seq {
  SeqSpec spec;
  Sampler sampler;
  std::vector<int32_t> ctx;             // the prompt, then the sampled ids
  std::vector<int> cuts;                // checkpoint positions in (0, prompt), ascending
  int n_prompt = 0;
  int slot = -1;                        // the slot it runs in, or -1 (waiting)
  int consumed = 0;                     // tokens of ctx its slot has consumed
  uint64_t order = 0;                   // admission order: preemption takes the newest
  uint64_t key = 0;                     // names it to the backend (BatchEntry::key)
  bool backend_draws = false;           // the backend draws its ids (BatchBackend::draws)
  bool admitted_once = false, prefilled = false;
  bool done = false;                    // on_done ran
  bool tail = false;                    // done, and turn_tail still to be fed in its slot
  bool preempted = false;               // dropped in this step, to go back to the queue
  // The id commit() took into ctx and deliver() has not reported yet; `ending`: the sequence ends there (stop:
  // a stop id; length: max_tokens or the context), so it takes no further pass.
  struct Report {
    SampledToken token;
    int index = 0;
    bool stop = false;
  };
  std::optional<Report> report;
  FinishReason ending = FinishReason::none;
  SeqResult result;
  Seq(SeqSpec s, int vocab) : spec(std::move(s)), sampler(spec.sampling.params, vocab) {}
};

namespace {

int lcp(const std::vector<int32_t>& a, const std::vector<int32_t>& b, int limit) {
  int n = std::min({static_cast<int>(a.size()), static_cast<int>(b.size()), limit});
  int i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

Scheduler::Scheduler(BatchBackend& backend, SchedulerOptions options)
    : be_(backend),
      opt_(options),
      vocab_(backend.config().vocab),
      max_context_(backend.max_context()),
      kv_pool_(options.kv_pages > 0 ? options.kv_pages
                                    : backend.max_seqs() * PageTable::pages_for(backend.max_context(), options.kv_page_tokens)),
      cache_(options.cache_bytes) {
  LILY_CHECK(opt_.kv_page_tokens >= 1 && opt_.max_step_tokens >= 1 && opt_.prefill_chunk >= 1,
             "scheduler: kv_page_tokens, max_step_tokens and prefill_chunk must be >= 1");
  LILY_CHECK(be_.max_seqs() >= 1, "scheduler: the backend has no state slot");
  slots_.reserve(static_cast<size_t>(be_.max_seqs()));
  for (int i = 0; i < be_.max_seqs(); ++i) slots_.emplace_back(opt_.kv_page_tokens);
  logits_.resize(static_cast<size_t>(be_.max_seqs()) * vocab_);
  mask_.resize(static_cast<size_t>((vocab_ + 31) / 32));
}

Scheduler::~Scheduler() = default;

void Scheduler::add(SeqSpec spec) {
  const int n = static_cast<int>(spec.prompt.size());
  LILY_CHECK(n >= 1, "scheduler: empty prompt");
  LILY_CHECK(spec.max_tokens >= 1, "scheduler: max_tokens must be >= 1, got ", spec.max_tokens);
  LILY_CHECK(n < max_context_, "scheduler: a prompt of ", n, " tokens does not fit the context of ", max_context_);
  LILY_CHECK(PageTable::pages_for(n, opt_.kv_page_tokens) <= kv_pool_.capacity(), "scheduler: a prompt of ", n,
             " tokens does not fit the KV pool of ", kv_pool_.capacity() * opt_.kv_page_tokens, " tokens");
  for (int32_t t : spec.prompt)
    LILY_CHECK(t >= 0 && t < vocab_, "scheduler: prompt token id ", t, " outside [0, ", vocab_, ")");
  auto s = std::make_unique<Seq>(std::move(spec), vocab_);  // the Sampler validates the parameters
  s->key = ++keys_;
  s->backend_draws = !s->spec.sampling.filter && be_.draws(s->spec.sampling.params);
  s->sampler.add_prompt(s->spec.prompt);
  s->ctx = s->spec.prompt;
  s->n_prompt = n;
  s->cuts = prompt_checkpoints(s->spec.checkpoints, n, opt_.checkpoint_interval, be_.prompt_grid());
  waiting_.push_back(std::move(s));
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats st;
  for (const auto& s : running_) st.running += s->done ? 0 : 1;
  st.waiting = static_cast<int>(waiting_.size());
  for (const Slot& sl : slots_) st.slots_used += sl.owner ? 1 : 0;
  st.slots_total = static_cast<int>(slots_.size());
  st.kv_pages_used = kv_pool_.in_use();
  st.kv_pages_total = kv_pool_.capacity();
  st.kv_page_tokens = opt_.kv_page_tokens;
  st.preemptions = preemptions_;
  st.cached_tokens = cached_tokens_;
  st.steps = steps_;
  st.cache_entries = cache_.count();
  st.cache_bytes = cache_.bytes();
  return st;
}

// Frees the pages of idle slots, least recently used first, until `pages_needed` are free; never `keep`.
bool Scheduler::evict_idle(int pages_needed, const Slot* keep) {
  while (kv_pool_.available() < pages_needed) {
    Slot* lru = nullptr;
    for (Slot& sl : slots_)
      if (!sl.owner && &sl != keep && !sl.kv.pages().empty() && (!lru || sl.last_used < lru->last_used)) lru = &sl;
    if (!lru) return false;
    lru->kv.release(kv_pool_);
    lru->tokens.clear();
    be_.reset(static_cast<int>(lru - slots_.data()));
  }
  return true;
}

bool Scheduler::reserve(Slot& slot, int n_tokens) {
  const int need = PageTable::pages_for(n_tokens, opt_.kv_page_tokens) - static_cast<int>(slot.kv.pages().size());
  if (need > 0 && !evict_idle(need, &slot)) return false;
  return slot.kv.reserve(kv_pool_, n_tokens);
}

// Finds a slot and the longest reusable prefix for `s`; false (nothing changed) when no slot or too few pages.
bool Scheduler::admit(Seq& s) {
  const int L = static_cast<int>(s.ctx.size());
  const int limit = L - 1;  // at least one token is recomputed, for its logits
  int dst = -1, src = -1, start = 0;
  const StateSnapshot* snap = nullptr;
  // A free slot to start from scratch: an empty one, else the least recently used idle one.
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    const Slot& sl = slots_[i];
    if (sl.owner) continue;
    if (dst < 0 || (sl.tokens.empty() && !slots_[dst].tokens.empty()) ||
        (sl.tokens.empty() == slots_[dst].tokens.empty() && sl.last_used < slots_[dst].last_used))
      dst = i;
  }
  if (dst < 0) return false;
  if (opt_.prefix_cache) {
    int best_lcp = 0;
    std::vector<int> common(slots_.size());
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
      const Slot& sl = slots_[i];
      common[i] = lcp(sl.tokens, s.ctx, limit);
      best_lcp = std::max(best_lcp, common[i]);
      // An idle slot whose tokens all prefix the context continues from its live state.
      if (!sl.owner && common[i] == static_cast<int>(sl.tokens.size()) && common[i] > start) {
        dst = i;
        start = common[i];
      }
    }
    if (best_lcp > start)
      if (const StateSnapshot* c = cache_.lookup(s.ctx, best_lcp); c && c->position > start) {
        snap = c;
        start = c->position;
        src = -1;
        for (int i = 0; i < static_cast<int>(slots_.size()); ++i)  // holder of the KV: an idle one is taken as is
          if (common[i] >= start && (src < 0 || (!slots_[i].owner && slots_[src].owner))) src = i;
        if (!slots_[src].owner) {
          dst = src;
          src = -1;
        } else if (dst == src || slots_[dst].owner) {
          dst = -1;  // a free slot other than the holder
          for (int i = 0; i < static_cast<int>(slots_.size()); ++i)
            if (!slots_[i].owner && (dst < 0 || slots_[i].last_used < slots_[dst].last_used)) dst = i;
        }
      }
  }
  Slot& d = slots_[dst];
  // Pages: what the slot keeps of its own, plus the whole context; idle slots (not the source) can be evicted.
  const int keep_pages = std::min(static_cast<int>(d.kv.pages().size()), PageTable::pages_for(start, opt_.kv_page_tokens));
  const int need = PageTable::pages_for(L, opt_.kv_page_tokens) - keep_pages;
  int evictable = kv_pool_.available() + static_cast<int>(d.kv.pages().size()) - keep_pages;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i)
    if (!slots_[i].owner && i != dst && i != src) evictable += static_cast<int>(slots_[i].kv.pages().size());
  // A page of headroom per running sequence that may still grow into a new page, so an admission does not force
  // a preemption at the next step.
  int headroom = 0;
  for (const auto& r : running_) {
    if (r->done || r->slot < 0) continue;
    const int most = std::min(r->n_prompt + r->spec.max_tokens, max_context_);
    headroom += PageTable::pages_for(most, opt_.kv_page_tokens) > static_cast<int>(slots_[r->slot].kv.pages().size());
  }
  if (evictable < need + headroom) return false;

  if (src >= 0) {
    be_.copy_prefix(dst, src, start);
    be_.restore_state(dst, *snap);
  } else if (snap) {
    be_.restore_state(dst, *snap);
  } else if (start == 0) {
    be_.reset(dst);
  }
  d.tokens.assign(s.ctx.begin(), s.ctx.begin() + start);
  d.kv.truncate(kv_pool_, start);
  d.owner = &s;
  if (!reserve(d, L)) {  // cannot happen after the count above; keep the slot consistent if it does
    d.owner = nullptr;
    return false;
  }
  d.last_used = ++clock_;
  s.slot = dst;
  s.consumed = start;
  s.order = ++admissions_;
  if (!s.admitted_once) {
    s.admitted_once = true;
    s.result.n_cached = start;
    cached_tokens_ += start;
    if (s.spec.on_admitted) s.spec.on_admitted(start);
  }
  return true;
}

// Takes the sequence out of its slot: the slot keeps its consumed tokens (KV and live state) for reuse, or is
// emptied (its state is not usable, or its pages are needed).
void Scheduler::release(Seq& s, bool keep_tokens) {
  if (s.slot < 0) return;
  Slot& sl = slots_[s.slot];
  sl.owner = nullptr;
  sl.last_used = ++clock_;
  if (keep_tokens) {
    sl.kv.truncate(kv_pool_, static_cast<int>(sl.tokens.size()));
  } else {
    sl.kv.release(kv_pool_);
    sl.tokens.clear();
    be_.reset(s.slot);
  }
  s.slot = -1;
}

void Scheduler::finish(Seq& s, FinishReason reason) {
  deliver(s);  // an id drawn before goes out first (and may itself end the sequence)
  if (s.done) return;
  s.done = true;
  s.result.finish = reason;
  if (s.spec.on_done) s.spec.on_done(s.result);
}

void Scheduler::preempt(Seq& s) {
  release(s, false);
  s.consumed = 0;
  s.preempted = true;
  s.result.preemptions++;
  preemptions_++;
}

void Scheduler::abort_all(FinishReason reason, const std::string& error) {
  for (auto& s : running_) {
    if (!s->done && reason == FinishReason::error) s->result.error = error;
    finish(*s, reason);
    release(*s, false);
  }
  running_.clear();
  for (auto& s : waiting_) {
    if (reason == FinishReason::error) s->result.error = error;
    finish(*s, reason);
  }
  waiting_.clear();
  reports_.clear();
}

// Draws the next id of `s` from its last position's logits (its own Sampler; the filter's mask in mask_, so
// filtered sequences are drawn on the scheduler's thread only).
Scheduler::Drawn Scheduler::draw(Seq& s, const float* logits, bool use_mask) {
  Drawn d;
  try {
    TokenFilter* filter = s.spec.sampling.filter;
    const bool masked = use_mask && filter && filter->allowed(mask_);
    d.token = s.sampler.sample(logits, masked ? mask_.data() : nullptr);
    d.ok = true;
  } catch (const NanLogitsError& e) {
    d.error = e.what();
    d.nan = true;
  } catch (const std::exception& e) {
    d.error = e.what();
  }
  return d;
}

// Takes the drawn id of `s` into its context; it is reported by deliver() (in the next step(), while that
// step's pass runs).
void Scheduler::commit(Seq& s, Drawn d) {
  if (!d.ok) {
    s.result.error = d.error;
    s.result.nan_logits = d.nan;
    finish(s, FinishReason::error);
    release(s, false);  // the state that produced the logits is not to be trusted
    return;
  }
  SampledToken t = std::move(d.token);
  if (TokenFilter* filter = s.spec.sampling.filter) filter->accept(t.token);
  if (!s.spec.sampling.logprobs) t.logprob = std::numeric_limits<float>::quiet_NaN();
  s.ctx.push_back(t.token);
  const int index = s.result.n_generated++;
  const bool stop = std::find(s.spec.stop_ids.begin(), s.spec.stop_ids.end(), t.token) != s.spec.stop_ids.end();
  if (stop) s.ending = FinishReason::stop;
  else if (s.result.n_generated >= s.spec.max_tokens || static_cast<int>(s.ctx.size()) > max_context_)
    s.ending = FinishReason::length;  // no room to consume the new id
  s.report = Seq::Report{std::move(t), index, stop};
  reports_.push_back(&s);
}

// Reports the id commit() left and ends the sequence where it ends. Its slot goes back in drop_ended(), at the end
// of the step (it may be in the pass now running).
void Scheduler::deliver(Seq& s) {
  if (!s.report) return;
  Seq::Report r = std::move(*s.report);
  s.report.reset();
  if (s.done) return;
  const FinishReason ended = s.spec.on_token ? s.spec.on_token(r.token, r.index, r.stop) : FinishReason::none;
  if (s.ending == FinishReason::none && ended == FinishReason::none) return;
  s.result.stopped_by_id = r.stop;
  finish(s, r.stop ? FinishReason::stop : ended != FinishReason::none ? ended : s.ending);
  const auto& tail = s.spec.turn_tail;
  s.tail = r.stop && opt_.prefix_cache && !tail.empty() && tail.front() == r.token.token && s.slot >= 0 &&
           s.consumed + static_cast<int>(tail.size()) < max_context_;
}

void Scheduler::deliver_all() {
  for (Seq* s : reports_) deliver(*s);
  reports_.clear();
}

// Forgets the sequences that ended (after their turn tail, if any); their slots keep the consumed tokens for reuse.
void Scheduler::drop_ended() {
  std::erase_if(reports_, [](const Seq* s) { return s->done; });
  for (auto& s : running_)
    if (s->done && !s->tail) release(*s, true);
  std::erase_if(running_, [](const auto& s) { return s->done && !s->tail; });
}

// Whether `s` should wait for a running sequence that is still consuming a prefix they share (the same system
// prompt, or n samples of one prompt): that one gets a checkpoint where the common part ends, and `s` starts
// from it (its KV copied, the snapshot restored) instead of computing the same tokens again.
bool Scheduler::waits_for_prefix(const Seq& s) {
  if (!opt_.prefix_cache) return false;
  const int L = static_cast<int>(s.ctx.size());
  for (auto& rp : running_) {
    Seq& r = *rp;
    if (r.done || r.slot < 0) continue;
    const int whole = lcp(r.ctx, s.ctx, std::min(L - 1, r.n_prompt - 1));
    const int k = prompt_cut(whole, be_.prompt_grid());
    if (k < 1 || r.consumed >= k || (whole < kSharedPrefixMin && whole < L - 1)) continue;
    if (!std::binary_search(r.cuts.begin(), r.cuts.end(), k)) r.cuts.insert(std::upper_bound(r.cuts.begin(), r.cuts.end(), k), k);
    return true;
  }
  return false;
}

int Scheduler::step() {
  // Interruptions: running sequences keep their consumed tokens in the slot; waiting ones just end. An id drawn
  // but not reported yet is reported first (finish()), unless the request was cancelled.
  for (auto& s : running_)
    if (!s->done && s->spec.interrupt)
      if (const FinishReason r = s->spec.interrupt(); r != FinishReason::none) {
        if (r == FinishReason::cancelled) s->report.reset();  // nobody reads it
        finish(*s, r);
        s->tail = false;
        release(*s, true);
      }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Seq& s = **it;
    const FinishReason r =
        s.done ? FinishReason::none : s.spec.interrupt ? s.spec.interrupt() : FinishReason::none;
    if (r == FinishReason::cancelled) s.report.reset();
    if (r != FinishReason::none) finish(s, r);
    if (!s.done) {  // (a preempted sequence may have ended at its last id's report)
      ++it;
      continue;
    }
    std::erase(reports_, &s);
    it = waiting_.erase(it);
  }
  drop_ended();

  // Admission in FIFO order; a sequence waiting for a running one's prompt to pass their common prefix is
  // skipped, the first that does not fit stops the line.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Seq& s = **it;
    if (PageTable::pages_for(static_cast<int>(s.ctx.size()), opt_.kv_page_tokens) > kv_pool_.capacity()) {
      finish(s, FinishReason::length);  // its context outgrew the whole KV pool
      std::erase(reports_, &s);
      it = waiting_.erase(it);
      continue;
    }
    if (waits_for_prefix(s)) {
      ++it;
      continue;
    }
    if (!admit(s)) break;
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
  }

  // The batch: turn tails, decode ids (always), then prompt pieces in admission order within the token budget.
  struct Item {
    Seq* seq;
    int n;
    bool logits;
  };
  std::vector<Item> items;
  int budget = opt_.max_step_tokens;
  for (auto& sp : running_) {
    Seq& s = *sp;
    if (!s.tail) continue;
    const int n = static_cast<int>(s.spec.turn_tail.size());
    if (reserve(slots_[s.slot], s.consumed + n)) items.push_back({&s, n, false});
    else release(s, true), s.tail = false;
  }
  for (auto& sp : running_) {
    Seq& s = *sp;
    if (s.done || s.preempted || s.ending != FinishReason::none || s.result.n_generated == 0 ||
        static_cast<int>(s.ctx.size()) - s.consumed != 1)
      continue;
    // the newest running sequence that goes on
    const auto goes_on = [](const auto& o) {
      return !o->done && !o->preempted && o->ending == FinishReason::none && o->slot >= 0;
    };
    while (s.slot >= 0 && !reserve(slots_[s.slot], s.consumed + 1)) {
      Seq* victim = nullptr;
      for (auto& o : running_)
        if (goes_on(o) && (!victim || o->order > victim->order)) victim = o.get();
      if (victim == &s && std::count_if(running_.begin(), running_.end(), goes_on) == 1) {
        finish(s, FinishReason::length);  // alone and still no room: the KV pool is the limit
        release(s, true);
        break;
      }
      preempt(*victim);
    }
    if (s.slot < 0 || s.done) continue;
    items.push_back({&s, 1, true});
    budget -= 1;
  }
  const int decoding =
      static_cast<int>(std::count_if(items.begin(), items.end(), [](const Item& it) { return it.logits; }));
  if (decoding > 0 && opt_.decode_step_tokens > 0)
    budget = std::min(budget, std::max(opt_.decode_step_tokens - decoding, kMinPromptTokens));
  int prompt_pieces = 0;
  for (auto& sp : running_) {
    Seq& s = *sp;
    if (s.done || s.preempted || s.slot < 0) continue;
    const int left = static_cast<int>(s.ctx.size()) - s.consumed;
    if (s.result.n_generated > 0 && left == 1) continue;  // decoding: above
    if (budget <= 0) break;
    int end = s.consumed + std::min({left, opt_.prefill_chunk, budget});
    for (int c : s.cuts)
      if (c > s.consumed && c < end) {
        end = c;
        break;
      }
    // A piece that stops inside the prompt ends on the backend's prompt grid, so where the step's budget falls
    // (other sequences' decode rows) does not change the prompt's arithmetic. Less than a grid step left: the
    // next step, unless no prompt piece went yet (a budget or prefill_chunk below the grid: progress first).
    if (end < static_cast<int>(s.ctx.size())) {
      const int on_grid = prompt_cut(end, be_.prompt_grid());
      if (on_grid > s.consumed) end = on_grid;
      else if (prompt_pieces > 0) continue;
    }
    ++prompt_pieces;
    items.push_back({&s, end - s.consumed, end == static_cast<int>(s.ctx.size())});
    budget -= end - s.consumed;
  }
  // Preempted sequences go back to the head of the queue, oldest first.
  std::vector<Seq*> back;
  for (auto& s : running_)
    if (s->preempted) back.push_back(s.get());
  std::sort(back.begin(), back.end(), [](const Seq* a, const Seq* b) { return a->order > b->order; });
  for (Seq* p : back) {
    auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == p; });
    p->preempted = false;
    waiting_.push_front(std::move(*it));
    running_.erase(it);
  }
  if (items.empty()) {
    deliver_all();
    drop_ended();
    return 0;
  }

  std::vector<BatchEntry> batch;
  batch.reserve(items.size());
  std::vector<SampledToken> by_backend(items.size());  // ids the backend drew
  int n_tokens = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Seq& s = *items[i].seq;
    const int32_t* from = s.tail ? s.spec.turn_tail.data() : s.ctx.data() + s.consumed;
    BatchEntry e{s.slot, std::span<const int32_t>(from, static_cast<size_t>(items[i].n)), nullptr};
    if (items[i].logits && s.backend_draws) {
      e.sampler = &s.sampler;
      e.drawn = &by_backend[i];
      e.key = s.key;
    } else if (items[i].logits) {
      e.logits = logits_.data() + i * static_cast<size_t>(vocab_);
    }
    batch.push_back(e);
    n_tokens += items[i].n;
  }
  // The pass runs while the previous step's ids are reported.
  std::string failure;
  bool begun = false;
  try {
    be_.step_begin(batch);
    begun = true;
    deliver_all();
    begun = false;
    be_.step_end();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (begun) be_.step_end();  // a report threw: the pass still ends before the error goes on
  if (!failure.empty()) {
    for (const Item& it : items) {  // their slots' states are unknown
      if (!it.seq->done) it.seq->result.error = failure;
      finish(*it.seq, FinishReason::error);
      it.seq->tail = false;
      release(*it.seq, false);
    }
    deliver_all();
    drop_ended();
    return static_cast<int>(items.size());
  }
  ++steps_;
  if (on_step) on_step(static_cast<int>(items.size()), n_tokens);

  for (size_t i = 0; i < items.size(); ++i) {
    Seq& s = *items[i].seq;
    Slot& sl = slots_[s.slot];
    const int32_t* fed = batch[i].tokens.data();
    sl.tokens.insert(sl.tokens.end(), fed, fed + items[i].n);
    sl.last_used = ++clock_;
    if (s.tail) {  // the next turn starts here: remember it
      cache_.insert(sl.tokens, be_.save_state(s.slot));
      s.tail = false;
      release(s, true);
      continue;
    }
    s.consumed += items[i].n;
    if (opt_.prefix_cache && std::binary_search(s.cuts.begin(), s.cuts.end(), s.consumed))
      cache_.insert(std::span(s.ctx.data(), static_cast<size_t>(s.consumed)), be_.save_state(s.slot));
  }
  // The next ids: drawn in parallel where the sequence has no structured-output filter (each Sampler is its own;
  // filters may share a grammar's memo tables), then reported in the batch's order on this thread.
  std::vector<Drawn> drawn(items.size());
  std::vector<size_t> free;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].logits || items[i].seq->done) continue;
    if (batch[i].drawn) {  // drawn by the backend
      Drawn& d = drawn[i];
      if (batch[i].drawn->token >= 0) {
        d.token = std::move(*batch[i].drawn);
        d.ok = true;
      } else {
        d.error = "sampler: NaN among the logits";
        d.nan = true;
      }
    } else if (!items[i].seq->spec.sampling.filter) {
      free.push_back(i);
    }
  }
  ThreadPool::global().parallel_for(0, static_cast<int64_t>(free.size()), [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) drawn[free[k]] = draw(*items[free[k]].seq, batch[free[k]].logits, false);
  });
  for (size_t i = 0; i < items.size(); ++i) {
    Seq& s = *items[i].seq;
    if (!items[i].logits || s.done) continue;
    if (!s.prefilled) {
      s.prefilled = true;
      if (s.spec.on_prefilled) s.spec.on_prefilled();
    }
    if (s.spec.sampling.filter) drawn[i] = draw(s, batch[i].logits, true);
    commit(s, std::move(drawn[i]));
  }
  drop_ended();
  return static_cast<int>(items.size());
}

}  // namespace lily
