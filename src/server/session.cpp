// Per-request output handling: parser / detokenizer -> stop strings -> events (see session.h).
#include "server/session.h"

namespace lily::server {
namespace {

OutEvent text_event(OutEvent::Kind kind, std::string text) {
  OutEvent e;
  e.kind = kind;
  e.text = std::move(text);
  return e;
}

}  // namespace

void Wakeup::notify() {
  {
    std::lock_guard l(mu_);
    ++seq_;
  }
  cv_.notify_all();
}

uint64_t Wakeup::seq() {
  std::lock_guard l(mu_);
  return seq_;
}

void Wakeup::wait(uint64_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock l(mu_);
  cv_.wait_for(l, timeout, [&] { return seq_ != seen; });
}

Session::Session(const Tokenizer& tok, SessionOptions opt) : tok_(tok), opt_(std::move(opt)), stop_(opt_.stop) {
  if (opt_.chat) parser_ = std::make_unique<chat::OutputParser>(opt_.parser, opt_.tools);
  else decoder_.emplace(tok_);
}

void Session::emit(OutEvent ev) {
  switch (ev.kind) {
    case OutEvent::Kind::reasoning: reasoning += ev.text; break;
    case OutEvent::Kind::content: content += ev.text; break;
    case OutEvent::Kind::text: text += ev.text; break;
    case OutEvent::Kind::tool_header: tool_calls.push_back({ev.id, ev.name, ""}); break;
    case OutEvent::Kind::tool_args:
      if (!tool_calls.empty()) tool_calls.back().arguments += ev.text;
      break;
  }
  std::lock_guard l(mu_);
  pending_.push_back(std::move(ev));
}

void Session::flush_stop() {
  std::string rest = stop_.flush();
  if (!rest.empty()) emit(text_event(held_kind_, std::move(rest)));
}

void Session::route_text(OutEvent::Kind kind, const std::string& t) {
  if (ended_) return;
  if (kind != held_kind_) {
    flush_stop();
    held_kind_ = kind;
  }
  std::string out = stop_.push(t);
  if (!out.empty()) emit(text_event(kind, std::move(out)));
  if (stop_.matched()) {
    ended_ = true;
    stop_string_hit = true;
    stop_string = stop_.matched_string();
  }
}

void Session::route(const chat::ParserEvent& e) {
  using K = chat::ParserEvent::Kind;
  if (ended_) return;
  switch (e.kind) {
    case K::reasoning: route_text(OutEvent::Kind::reasoning, e.text); break;
    case K::content: route_text(OutEvent::Kind::content, e.text); break;
    case K::tool_header:
    case K::tool_args: {
      if (!opt_.parallel_tool_calls && e.index >= 1) {
        ended_ = true;  // parallel_tool_calls = false: stop after the first call
        return;
      }
      flush_stop();
      OutEvent ev;
      ev.kind = e.kind == K::tool_header ? OutEvent::Kind::tool_header : OutEvent::Kind::tool_args;
      ev.text = e.text;
      ev.index = e.index;
      ev.id = e.id;
      ev.name = e.name;
      emit(std::move(ev));
      break;
    }
  }
}

void Session::release_lp() {
  if (!held_lp_) return;
  all_logprobs.push_back(*held_lp_);
  std::lock_guard l(mu_);
  pending_lp_.push_back(std::move(*held_lp_));
  held_lp_.reset();
}

bool Session::on_token(const SampledToken& ev) {
  const size_t c0 = content.size(), t0 = text.size(), r0 = reasoning.size();
  const int rt0 = parser_ ? parser_->result().reasoning_tokens : 0;
  if (parser_) {
    scratch_.clear();
    parser_->feed(ev.token, tok_.token_text(ev.token), scratch_);
    for (auto& e : scratch_) route(e);
  } else {
    route_text(OutEvent::Kind::text, decoder_->push(ev.token));
  }
  if (opt_.logprobs) {
    release_lp();
    held_lp_.emplace();
    static_cast<SampledToken&>(*held_lp_) = ev;
    held_lp_->text = opt_.chat ? content.substr(c0) : text.substr(t0);
    held_lp_->reasoning = reasoning.substr(r0);
    held_lp_->reasoning_token = parser_ && parser_->result().reasoning_tokens > rt0;
  }
  cv_.notify_all();
  if (opt_.wake) opt_.wake->notify();
  return !ended_;
}

void Session::on_done(const GenJob& job) {
  const size_t c0 = content.size(), t0 = text.size(), r0 = reasoning.size();
  if (parser_) {
    scratch_.clear();
    parser_->finish(scratch_);
    for (auto& e : scratch_) route(e);
    reasoning_tokens = parser_->result().reasoning_tokens;
    tool_call_parse_failures = parser_->result().tool_call_parse_failures;
  } else if (!ended_) {
    route_text(OutEvent::Kind::text, decoder_->flush());
  }
  if (!ended_) flush_stop();
  if (held_lp_) {
    held_lp_->text += opt_.chat ? content.substr(c0) : text.substr(t0);
    held_lp_->reasoning += reasoning.substr(r0);
    release_lp();
  }
  {
    std::lock_guard l(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (opt_.wake) opt_.wake->notify();
}

bool Session::finished() {
  std::lock_guard l(mu_);
  return done_;
}

bool Session::take(std::vector<OutEvent>& events, std::vector<LogprobEntry>& lps, std::chrono::milliseconds timeout) {
  std::unique_lock l(mu_);
  cv_.wait_for(l, timeout, [&] { return done_ || !pending_.empty() || !pending_lp_.empty(); });
  events.insert(events.end(), std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
  pending_.clear();
  lps.insert(lps.end(), std::make_move_iterator(pending_lp_.begin()), std::make_move_iterator(pending_lp_.end()));
  pending_lp_.clear();
  return done_;
}

}  // namespace lily::server
