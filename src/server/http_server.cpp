// HTTP routes, lifecycle and the generation endpoints (see http_server.h). Response formatting lives in
// responses.cpp; sockets, limits and framing in http_transport.cpp.
#include "server/http_server.h"

#include <algorithm>
#include <cctype>
#include <random>

#include "server/api_error.h"
#include "server/conn_watch.h"
#include "server/health.h"
#include "server/job_setup.h"
#include "server/messages_api.h"
#include "server/request.h"
#include "server/responses.h"
#include "server/responses_api.h"
#include "server/session.h"
#include "server/structured_output.h"
#include "util/check.h"
#include "util/log.h"

namespace lily::server {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);
// A waiting request looks at its client's socket this often: a client gone while its prompt is processed is
// noticed within this (issue 28: a cancelled request stops within 50 ms, the piece in progress included).
constexpr auto kPeerPoll = std::chrono::milliseconds(10);
constexpr double kPingSeconds = 15;

std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = hex[rng() & 15];
  return s;
}

// CR/LF and control characters escaped before a request field reaches the log (CWE-117).
std::string log_safe(const std::string& s, size_t max = 128) {
  std::string out;
  for (unsigned char c : s.substr(0, max)) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out;
}

void send_json(HttpResponse& res, int status, const nlohmann::ordered_json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(HttpResponse& res, const ApiError& e) {
  if (e.retry_after > 0) res.set_header("Retry-After", std::to_string(e.retry_after));
  res.status = e.status;
  res.set_content(dump_json(e.to_json()), "application/json");
}

// Equal strings, in a time that depends only on the length of `secret` (the configured API key).
bool same_key(const std::string& given, const std::string& secret) {
  unsigned char diff = given.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(secret[i]));
  }
  return diff == 0;
}

std::string lower(std::string s) {
  for (auto& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return s;
}

// The host name of a Host header value, lower case, without the port ("[::1]:8080" -> "[::1]").
std::string host_name(const std::string& host) {
  std::string h = lower(host);
  if (!h.empty() && h[0] == '[') {
    size_t close = h.find(']');
    return close == std::string::npos ? h : h.substr(0, close + 1);
  }
  size_t colon = h.find(':');
  return colon == std::string::npos ? h : h.substr(0, colon);
}

// %XX sequences decoded (a model id in a path, as clients encode it); a malformed one is kept as it is.
std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "::1" || host == "localhost" || host.rfind("127.", 0) == 0;
}

// A POST body must be JSON: application/json, parameters (charset) allowed. Blocks HTML form and text/plain
// posts from a web page (they need no CORS preflight).
bool json_media_type(const std::string& ct) {
  std::string t = lower(ct.substr(0, ct.find(';')));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.erase(0, 1);
  return t == "application/json";
}

// Choice i of a request (`n`): its job samples with seed + i; top_logprobs > 0 sets the alternatives listed.
std::shared_ptr<GenJob> choice_job(const std::vector<int32_t>& prompt, const SamplingParams& sampling, int i,
                                   int max_tokens, bool logprobs, int top_logprobs,
                                   const std::vector<int32_t>& stop_ids) {
  auto job = std::make_shared<GenJob>();
  job->prompt = prompt;
  job->sampling = sampling;
  job->sampling.seed += static_cast<uint64_t>(i);
  if (top_logprobs > 0) job->sampling.top_logprobs = top_logprobs;
  job->max_tokens = max_tokens;
  job->logprobs = logprobs;
  job->stop_ids = stop_ids;
  return job;
}

}  // namespace

// One generation request: per choice (`n`, docs/api.md §2) the job the engine runs and the session that turns
// its tokens into events. Choice i is jobs[i] / sessions[i]; /v1/responses and /v1/messages have one choice.
struct HttpServer::Gen {
  std::vector<std::shared_ptr<GenJob>> jobs;       // [n]
  std::vector<std::shared_ptr<Session>> sessions;  // [n]
  std::shared_ptr<Wakeup> wake = std::make_shared<Wakeup>();  // news from any of the sessions
  ResponseInfo info;                // ids, model name, flags for formatting
  std::shared_ptr<ApiFormat> api;   // /v1/responses, /v1/messages: their formatter (null: chat / completions)
  std::string endpoint = "chat";    // metrics label
  int fd = -1;                      // the client's socket (disconnect polling)
  Clock::time_point arrival = Clock::now();

  std::vector<ChoiceOut> choices() const {
    std::vector<ChoiceOut> out;
    for (size_t i = 0; i < jobs.size(); ++i) out.push_back({sessions[i].get(), jobs[i].get()});
    return out;
  }
};

HttpServer::HttpServer(ServerOptions opt) : opt_(std::move(opt)) {
  fingerprint_ = "lily-0.1.0";
  metrics_.set_capacity(1, opt_.queue);  // until set_model: the engine's sequence slots
  // The Host check (DNS rebinding, cross-site posts to a keyless local server): explicit names, or by default
  // the loopback names when bound to loopback without an API key.
  if (!opt_.allowed_hosts.empty()) {
    for (const auto& h : opt_.allowed_hosts)
      if (h != "*") hosts_.push_back(host_name(h));
    if (std::find(opt_.allowed_hosts.begin(), opt_.allowed_hosts.end(), "*") != opt_.allowed_hosts.end())
      hosts_.clear();
  } else if (is_loopback(opt_.host) && opt_.api_key.empty()) {
    hosts_ = {"localhost", "127.0.0.1", "[::1]"};
  }
  HttpLimits lim;
  lim.max_body = opt_.max_body;
  lim.max_connections = opt_.max_connections;
  lim.header_timeout_s = opt_.header_timeout_s;
  lim.read_timeout_s = opt_.read_timeout_s;
  lim.io_threads = opt_.io_threads;
  // a streaming request holds its worker until it ends: room for every running and queued one, and 32 more for
  // the short requests (tokenize, health, metrics)
  lim.workers = opt_.http_threads > 0 ? opt_.http_threads : opt_.queue + std::max(opt_.max_seqs, 8) + 32;
  lim.worker_backlog = std::max(64, lim.workers);
  HttpCallbacks cb;
  cb.on_header = [this](HttpRequest& req, HttpResponse& res) { return on_header(req, res); };
  cb.on_request = [this](HttpRequest& req, HttpResponse& res) { on_request(req, res); };
  cb.decorate = [this](const HttpRequest& req, HttpResponse& res) { decorate(req, res); };
  cb.closing = [this] { return draining_.load(); };
  http_ = std::make_unique<HttpTransport>(lim, std::move(cb));
  routes();
}

HttpServer::~HttpServer() {
  shutdown();
}

void HttpServer::bind() {
  port_ = http_->bind(opt_.host, opt_.port);
}

void HttpServer::start() {
  http_->start();
}

void HttpServer::set_model(std::unique_ptr<ServedModel> model) {
  model_ = std::move(model);
  EngineOptions eo;
  eo.queue_size = opt_.queue;
  eo.prefix_cache = opt_.prefix_cache;
  eo.cache_bytes = opt_.cache_bytes;
  eo.kv_tokens = opt_.kv_tokens;
  if (model_->batch) engine_ = std::make_unique<Engine>(*model_->batch, metrics_, eo);
  else engine_ = std::make_unique<Engine>(*model_->backend, metrics_, eo);
  metrics_.set_capacity(engine_->max_seqs(), opt_.queue);
  ready_.store(true);
}

void HttpServer::shutdown() {
  std::lock_guard l(shutdown_mu_);
  if (shut_) return;
  shut_ = true;
  draining_.store(true);
  auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(opt_.drain_s * 1000));
  if (engine_) engine_->shutdown(deadline);
  // Let the HTTP threads write what the engine produced (bounded).
  auto write_deadline = Clock::now() + std::chrono::seconds(5);
  while (in_flight_.load() > 0 && Clock::now() < write_deadline) std::this_thread::sleep_for(kPoll);
  http_->stop();
}

ServedModel& HttpServer::ready_model() {
  if (draining_.load()) {
    ApiError e(503, "unavailable_error", "shutting_down", "", "the server is shutting down");
    e.retry_after = 1;
    throw e;
  }
  if (!ready_.load()) {
    ApiError e(503, "unavailable_error", "loading", "", "Loading model");
    e.retry_after = 5;
    throw e;
  }
  return *model_;
}

void HttpServer::routes() {
  routes_ = {
      {"GET", "/metrics", false, &HttpServer::handle_metrics, false},
      {"GET", "/v1/models", false, &HttpServer::handle_models, false},
      {"GET", "/v1/models/", true, &HttpServer::handle_models, false},
      {"POST", "/v1/chat/completions", false, &HttpServer::handle_chat, true},
      {"POST", "/chat/completions", false, &HttpServer::handle_chat, true},
      {"POST", "/v1/completions", false, &HttpServer::handle_completion, true},
      {"POST", "/completions", false, &HttpServer::handle_completion, true},
      {"POST", "/v1/responses", false, &HttpServer::handle_responses, true},
      {"POST", "/v1/messages", false, &HttpServer::handle_messages, true},
      {"POST", "/v1/messages/count_tokens", false, &HttpServer::handle_messages, true},
      {"POST", "/tokenize", false, &HttpServer::handle_tokenize, true},
      {"POST", "/detokenize", false, &HttpServer::handle_detokenize, true},
      {"POST", "/apply-template", false, &HttpServer::handle_apply_template, true},
  };
  for (std::string_view path : kHealthPaths)  // readiness and liveness probes (server/health.h)
    routes_.push_back({"GET", std::string(path), false, &HttpServer::handle_health, false});
}

bool HttpServer::host_allowed(const std::string& host) const {
  // No Host at all (HTTP/1.0; HTTP/1.1 requires one): not a browser, which always sends it.
  if (hosts_.empty() || host.empty()) return true;
  const std::string h = host_name(host);
  return std::find(hosts_.begin(), hosts_.end(), h) != hosts_.end();
}

void HttpServer::decorate(const HttpRequest& req, HttpResponse& res) {
  if (!res.header("X-Request-Id").empty()) return;
  res.set_header("X-Request-Id", has_header(req.headers, "X-Request-Id") ? log_safe(req.header("X-Request-Id"), 64)
                                                                         : random_hex(16));
  if (!opt_.cors_origin.empty()) {
    res.set_header("Access-Control-Allow-Origin", opt_.cors_origin);
    res.set_header("Vary", "Origin");
  }
}

bool HttpServer::on_header(HttpRequest& req, HttpResponse& res) {
  auto send_error = [&req](HttpResponse& r, const ApiError& e) {  // Anthropic-shaped under /v1/messages
    if (req.path.rfind("/v1/messages", 0) == 0) send_json(r, e.status, anthropic_error(e));
    else ::lily::server::send_error(r, e);
  };
  // One id per request, in the log and in the response (a client's own X-Request-Id is kept).
  if (!has_header(req.headers, "X-Request-Id")) req.headers.emplace_back("X-Request-Id", random_hex(16));
  // Host first: a page on another origin that rebinds its name to 127.0.0.1 reaches nothing.
  if (!host_allowed(req.header("Host"))) {
    send_error(res, ApiError(403, "invalid_request_error", "host_not_allowed", "",
                             "the Host '" + log_safe(req.header("Host"), 64) +
                                 "' is not allowed (lily serve --allowed-hosts)"));
    return true;
  }
  if (!opt_.cors_origin.empty() && req.method == "OPTIONS") {
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key, X-Request-Id, Anthropic-Version, Anthropic-Beta, X-Lily-Logit-Bias");
    res.set_header("Access-Control-Max-Age", "86400");
    res.status = 204;
    return true;
  }
  // Authenticate on the path exactly as the router sees it.
  const std::string& p = req.path;
  bool open = health_probe(p) || p == "/metrics" || p == "/v1/models" || p.rfind("/v1/models/", 0) == 0;
  if (!opt_.api_key.empty() && !open) {
    std::string key;
    std::string auth = req.header("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
    else key = req.header("X-Api-Key");
    if (!same_key(key, opt_.api_key)) {
      send_error(res, ApiError(401, "authentication_error", "invalid_api_key", "", "invalid or missing API key"));
      return true;
    }
  }
  std::string allow;
  for (size_t i = 0; i < routes_.size(); ++i) {
    const Route& r = routes_[i];
    const bool match = r.prefix ? p.size() > r.path.size() && p.rfind(r.path, 0) == 0 : p == r.path;
    if (!match) continue;
    if (r.method != req.method) {
      if (allow.find(r.method) == std::string::npos) allow += (allow.empty() ? "" : ", ") + r.method;
      continue;
    }
    req.route = static_cast<int>(i);
    req.blocking = r.blocking;
    if (r.prefix) req.path_param = percent_decode(p.substr(r.path.size()));
    break;
  }
  if (req.route < 0 && !allow.empty()) {
    res.set_header("Allow", allow);
    send_error(res, ApiError(405, "invalid_request_error", "method_not_allowed", "",
                             req.method.substr(0, 16) + " is not allowed on " + log_safe(p) + " (allowed: " + allow + ")"));
    return true;
  }
  if (req.route < 0) {
    send_error(res, ApiError(404, "not_found_error", "", "", "no route for " + log_safe(req.method, 16) + " " + log_safe(p)));
    return true;
  }
  if (req.method == "POST" && !json_media_type(req.header("Content-Type"))) {
    send_error(res, ApiError(415, "invalid_request_error", "unsupported_media_type", "",
                             "the request body must be JSON (Content-Type: application/json)"));
    return true;
  }
  return false;
}

// Every handler runs inside this wrapper: errors become OpenAI error objects, nothing escapes.
void HttpServer::on_request(HttpRequest& req, HttpResponse& res) {
  try {
    (this->*routes_.at(static_cast<size_t>(req.route)).fn)(req, res);
  } catch (const ApiError& e) {
    send_error(res, e);
    if (draining_.load()) res.close = true;
  } catch (const std::exception& e) {
    log::error("internal error on ", log_safe(req.path), ": ", e.what());
    send_error(res, ApiError(500, "server_error", "internal_error", "", e.what()));
  }
}

void HttpServer::handle_health(const HttpRequest& req, HttpResponse& res) {
  const HealthReply h = health_reply(*health_probe(req.path), ready_.load(), draining_.load());
  if (h.retry_after > 0) res.set_header("Retry-After", std::to_string(h.retry_after));
  res.status = h.status;
  res.set_content(h.body, "application/json");
}

void HttpServer::handle_metrics(const HttpRequest&, HttpResponse& res) {
  res.set_content(metrics_.render(), "text/plain; version=0.0.4");
}

void HttpServer::handle_models(const HttpRequest& req, HttpResponse& res) {
  ServedModel& m = ready_model();
  nlohmann::ordered_json entry = {
      {"id", m.alias}, {"object", "model"}, {"created", m.created}, {"owned_by", "lily"},
      {"max_model_len", m.backend->max_context()},
      {"meta", {{"n_ctx_train", m.model->config.max_position_embeddings}, {"n_params", m.n_params},
                {"n_vocab", m.model->config.vocab}, {"size", m.size_bytes}, {"demo", m.demo}}}};
  if (!req.path_param.empty()) {
    if (req.path_param != m.alias)
      throw ApiError(404, "not_found_error", "model_not_found", "model", "the model '" + log_safe(req.path_param) + "' does not exist");
    send_json(res, 200, entry);
    return;
  }
  send_json(res, 200, {{"object", "list"}, {"data", nlohmann::ordered_json::array({entry})}});
}

void HttpServer::handle_tokenize(const HttpRequest& req, HttpResponse& res) {
  ServedModel& m = ready_model();
  RequestLimits lim{m.n_vocab};
  ojson b = parse_body(req.body, lim);
  std::vector<int32_t> ids;
  if (b.contains("messages")) {
    ChatRequest cr = parse_chat_request(b, lim);
    ojson kwargs = cr.chat_template_kwargs;
    std::string prompt = m.renderer->render(cr.messages, cr.tools, kwargs);
    ids = m.tokenizer->encode(prompt, true);
  } else {
    auto c = b.find("content");
    if (c == b.end() || !c->is_string()) throw invalid_value("content", "'content' must be a string");
    bool parse_special = true;
    if (b.contains("parse_special")) {
      if (!b["parse_special"].is_boolean()) throw invalid_value("parse_special", "'parse_special' must be a boolean");
      parse_special = b["parse_special"].get<bool>();
    }
    ids = m.tokenizer->encode(c->get<std::string>(), parse_special);
  }
  bool pieces = b.contains("with_pieces") && b["with_pieces"].is_boolean() && b["with_pieces"].get<bool>();
  ojson tokens = ojson::array();
  for (int32_t id : ids) {
    if (!pieces) { tokens.push_back(id); continue; }
    std::string raw = m.tokenizer->token_text(id);
    ojson piece;
    if (valid_utf8(raw)) piece = raw;
    else { piece = ojson::array(); for (unsigned char ch : raw) piece.push_back(int(ch)); }
    tokens.push_back({{"id", id}, {"piece", piece}});
  }
  send_json(res, 200, {{"tokens", tokens}});
}

void HttpServer::handle_detokenize(const HttpRequest& req, HttpResponse& res) {
  ServedModel& m = ready_model();
  ojson b = parse_body(req.body, {m.n_vocab});
  auto t = b.find("tokens");
  if (t == b.end() || !t->is_array()) throw invalid_value("tokens", "'tokens' must be an array of token ids");
  std::vector<int32_t> ids;
  for (auto& v : *t) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= m.n_vocab)
      throw invalid_value("tokens", "token ids must be integers in [0, " + std::to_string(m.n_vocab) + ")");
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  send_json(res, 200, {{"content", m.tokenizer->decode(ids)}});
}

void HttpServer::handle_apply_template(const HttpRequest& req, HttpResponse& res) {
  ServedModel& m = ready_model();
  ojson b = parse_body(req.body, {m.n_vocab});
  ChatRequest cr = parse_chat_request(b, {m.n_vocab});
  send_json(res, 200, {{"prompt", m.renderer->render(cr.messages, cr.tools, cr.chat_template_kwargs)}});
}

void HttpServer::handle_chat(const HttpRequest& req, HttpResponse& res) {
  ServedModel& m = ready_model();
  RequestLimits lim{m.n_vocab};
  ojson body = parse_body(req.body, lim);
  ChatRequest cr = parse_chat_request(body, lim);
  auto g = std::make_shared<Gen>();
  g->info.id = "chatcmpl-" + random_hex(24);
  run_chat(cr, g, req, res);
}

// POST /v1/responses: the request mapped onto a chat request (responses_api.h), then the chat pipeline.
void HttpServer::handle_responses(const HttpRequest& req, HttpResponse& res) {
  ServedModel& m = ready_model();
  RequestLimits lim{m.n_vocab};
  ojson body = parse_body(req.body, lim);
  apply_logit_bias_header(body, req.header("X-Lily-Logit-Bias"));
  ResponsesRequest rr = parse_responses_request(body, lim);
  auto g = std::make_shared<Gen>();
  g->api = std::make_shared<ResponsesFormat>(rr.echo);
  g->api->id = "resp_" + random_hex(24);
  g->endpoint = "responses";
  run_chat(rr.chat_req, g, req, res);
}

// POST /v1/messages and /v1/messages/count_tokens (messages_api.h); every error is Anthropic-shaped.
void HttpServer::handle_messages(const HttpRequest& req, HttpResponse& res) {
  try {
    ServedModel& m = ready_model();
    RequestLimits lim{m.n_vocab};
    ojson body = parse_body(req.body, lim);
    apply_logit_bias_header(body, req.header("X-Lily-Logit-Bias"));
    if (req.path == "/v1/messages/count_tokens") {
      ChatRequest cr = parse_messages_request(body, lim, true);
      ojson kwargs = {{"enable_thinking", opt_.default_thinking}, {"preserve_thinking", true}};  // as run_chat
      for (auto& [k, v] : cr.chat_template_kwargs.items()) kwargs[k] = v;
      std::string prompt = m.renderer->render(cr.messages, cr.tools, kwargs);
      send_json(res, 200, {{"input_tokens", m.tokenizer->encode(prompt, true).size()}});
      return;
    }
    ChatRequest cr = parse_messages_request(body, lim);
    auto g = std::make_shared<Gen>();
    g->api = std::make_shared<MessagesFormat>();
    g->api->id = "msg_" + random_hex(24);
    g->endpoint = "messages";
    run_chat(cr, g, req, res);
  } catch (const ApiError& e) {
    if (e.retry_after > 0) res.set_header("Retry-After", std::to_string(e.retry_after));
    send_json(res, e.status, anthropic_error(e));
  } catch (const std::exception& e) {
    log::error("internal error on ", log_safe(req.path), ": ", e.what());
    send_json(res, 500, anthropic_error(ApiError(500, "server_error", "internal_error", "", e.what())));
  }
}

// The chat pipeline every chat-shaped endpoint shares: render → tokens → job + session → submit_and_respond.
void HttpServer::run_chat(const ChatRequest& cr, std::shared_ptr<Gen> g, const HttpRequest& req,
                          HttpResponse& res) {
  ServedModel& m = *model_;
  ojson kwargs = ojson::object();
  kwargs["enable_thinking"] = opt_.default_thinking;
  kwargs["preserve_thinking"] = true;  // docs/api.md §11: replay reasoning so the next turn hits the prefix cache
  for (auto& [k, v] : cr.chat_template_kwargs.items()) kwargs[k] = v;
  std::string prompt = m.renderer->render(cr.messages, cr.tools, kwargs);

  const std::vector<int32_t> prompt_ids = m.tokenizer->encode(prompt, true);
  check_context(m, static_cast<int>(prompt_ids.size()), "messages");
  const bool in_reasoning = chat::initial_reasoning_state(prompt_ids, m.ids);
  const SamplingParams sampling = resolve_sampling(cr.sampling, m, in_reasoning ? SamplingMode::thinking
                                                                                 : SamplingMode::non_thinking);
  const int max_tokens = resolve_max_tokens(cr.max_tokens, m, static_cast<int>(prompt_ids.size()), opt_.max_tokens_cap);
  const std::vector<int> checkpoints = turn_checkpoints(prompt_ids, m);
  const int n = g->api ? 1 : cr.n;  // the Responses and Messages APIs have no n
  const chat::ToolSet tools = cr.tools.is_array() ? chat::ToolSet::from_json(cr.tools) : chat::ToolSet{};
  // Choice i samples with seed + i (a random base seed when the request sets none), so that it equals the
  // one-choice request with that seed; its tool-call ids likewise.
  for (int i = 0; i < n; ++i) {
    chat::ParserOptions po;
    po.ids = m.ids;
    po.start_in_reasoning = in_reasoning;
    if (cr.sampling.seed) po.id_seed = *cr.sampling.seed + static_cast<uint64_t>(i);
    SessionOptions so;
    so.chat = true;
    so.stop = cr.stop;
    so.parallel_tool_calls = cr.parallel_tool_calls;
    so.logprobs = cr.logprobs;
    so.parser = po;
    so.wake = g->wake;
    so.tools = tools;
    g->sessions.push_back(std::make_shared<Session>(*m.tokenizer, so));

    auto job = choice_job(prompt_ids, sampling, i, max_tokens, cr.logprobs, cr.logprobs ? cr.top_logprobs : 0,
                          m.stop_ids);
    job->turn_tail = m.turn_tail;
    job->checkpoints = checkpoints;
    // a filter keeps per-sequence grammar state: one per choice
    if (cr.structured) job->filter = make_token_filter(*cr.structured, *m.grammars, m.ids, in_reasoning);
    g->jobs.push_back(std::move(job));
  }

  g->info.chat = true;
  g->info.stream = cr.stream;
  g->info.include_usage = cr.include_usage;
  g->info.include_reasoning = cr.include_reasoning;
  g->info.logprobs = cr.logprobs;
  g->info.model = m.alias;
  g->info.fingerprint = fingerprint_;
  g->info.created = static_cast<int64_t>(std::time(nullptr));
  if (g->api) {
    g->api->model = m.alias;
    g->api->created = g->info.created;
    g->api->n_prompt = static_cast<int>(prompt_ids.size());
  }
  submit_and_respond(g, req, res);
}

void HttpServer::handle_completion(const HttpRequest& req, HttpResponse& res) {
  ServedModel& m = ready_model();
  RequestLimits lim{m.n_vocab};
  ojson body = parse_body(req.body, lim);
  CompletionRequest cr = parse_completion_request(body, lim);
  auto g = std::make_shared<Gen>();
  const std::vector<int32_t> prompt_ids =
      cr.prompt_is_tokens ? cr.prompt_tokens : m.tokenizer->encode(cr.prompt_text, true);
  if (prompt_ids.empty()) throw invalid_value("prompt", "'prompt' encodes to no tokens");
  check_context(m, static_cast<int>(prompt_ids.size()), "prompt");
  const SamplingParams sampling = resolve_sampling(cr.sampling, m, SamplingMode::raw);
  const int max_tokens = resolve_max_tokens(cr.max_tokens, m, static_cast<int>(prompt_ids.size()), opt_.max_tokens_cap);
  for (int i = 0; i < cr.n; ++i) {  // choice i samples with seed + i, as on the chat path
    SessionOptions so;
    so.chat = false;
    so.stop = cr.stop;
    so.logprobs = cr.logprobs >= 0;
    so.wake = g->wake;
    g->sessions.push_back(std::make_shared<Session>(*m.tokenizer, so));
    auto job = choice_job(prompt_ids, sampling, i, max_tokens, cr.logprobs >= 0, std::max(cr.logprobs, 0),
                          m.stop_ids);
    g->jobs.push_back(std::move(job));
  }
  g->info.chat = false;
  g->endpoint = "completions";
  g->info.stream = cr.stream;
  g->info.include_usage = cr.include_usage;
  g->info.logprobs = cr.logprobs >= 0;
  g->info.model = m.alias;
  g->info.fingerprint = fingerprint_;
  g->info.id = "cmpl-" + random_hex(24);
  g->info.created = static_cast<int64_t>(std::time(nullptr));
  if (cr.echo) g->info.echo = cr.prompt_is_tokens ? m.tokenizer->decode(cr.prompt_tokens) : cr.prompt_text;
  submit_and_respond(g, req, res);
}

void HttpServer::submit_and_respond(std::shared_ptr<Gen> g, const HttpRequest& req, HttpResponse& res) {
  ServedModel& m = *model_;
  const size_t n = g->jobs.size();
  for (size_t i = 0; i < n; ++i) {
    GenJob& job = *g->jobs[i];
    job.arrival = g->arrival;
    if (opt_.timeout_s > 0)
      job.deadline = g->arrival + std::chrono::milliseconds(static_cast<int64_t>(opt_.timeout_s * 1000));
    std::shared_ptr<Session> s = g->sessions[i];
    job.on_token = [s](const SampledToken& ev) { return s->on_token(ev); };
    job.on_done = [s, j = g->jobs[i].get()] { s->on_done(*j); };
  }
  g->fd = req.fd;
  engine_->submit_all(g->jobs);  // all n choices or none (a 429 / 503 before any byte is sent)
  in_flight_.fetch_add(1);
  auto cancel_all = [this, g] {
    for (auto& j : g->jobs) engine_->cancel(j);
  };

  // Waits for events from any choice; polls the client socket; cancels every job when the client is gone.
  // write(i, events, logprobs, finished): choice i's news (finished: its job has just ended). A choice that
  // ends in an error or cancellation ends the request: the other choices are cancelled (the caller reports it).
  // Returns false when the client is gone.
  using Write = std::function<bool(size_t, std::vector<OutEvent>&, std::vector<LogprobEntry>&, bool)>;
  auto pump = [this, g, cancel_all](const Write& write, const std::function<bool()>& ping) {
    auto last_write = Clock::now();
    std::vector<bool> done(g->jobs.size(), false);
    size_t n_done = 0;
    for (;;) {
      const uint64_t seen = g->wake->seq();
      bool news = false, failed = false;
      for (size_t i = 0; i < g->jobs.size(); ++i) {
        if (done[i]) continue;
        std::vector<OutEvent> ev;
        std::vector<LogprobEntry> lps;
        const bool finished = g->sessions[i]->take(ev, lps, std::chrono::milliseconds(0));
        if (finished) {
          done[i] = true;
          ++n_done;
          const FinishReason f = g->jobs[i]->finish;
          failed = failed || f == FinishReason::error || f == FinishReason::cancelled;
        }
        if (!ev.empty() || !lps.empty() || finished) {
          if (!write(i, ev, lps, finished)) {
            cancel_all();
            metrics_.client_disconnect();
            return false;
          }
          news = news || !ev.empty() || !lps.empty();
        }
      }
      if (news) last_write = Clock::now();
      if (failed) {
        cancel_all();
        return true;
      }
      if (n_done == g->jobs.size()) return true;
      if (ping && std::chrono::duration<double>(Clock::now() - last_write).count() > kPingSeconds) {
        if (!ping()) break;
        last_write = Clock::now();
      }
      if (peer_closed(g->fd)) break;
      g->wake->wait(seen, kPeerPoll);
    }
    cancel_all();
    metrics_.client_disconnect();
    return false;
  };
  // The job that ended the request in failure (error first, then cancellation), or null. Reads only jobs whose
  // session has reported the end (their result fields are then final).
  auto failure = [g]() -> const GenJob* {
    const GenJob* cancelled = nullptr;
    for (size_t i = 0; i < g->jobs.size(); ++i) {
      if (!g->sessions[i]->finished()) continue;
      const GenJob& j = *g->jobs[i];
      if (j.finish == FinishReason::error) return &j;
      if (j.finish == FinishReason::cancelled && !cancelled) cancelled = &j;
    }
    return cancelled;
  };
  auto record = [this, g, rid = log_safe(req.header("X-Request-Id"), 64), path = log_safe(req.path)](int status) {
    size_t n_prompt = 0;
    int n_cached = 0, n_generated = 0, n_reasoning = 0, parse_failures = 0;
    double queue_ms = 0, prompt_ms = 0, gen_ms = 0;
    for (size_t i = 0; i < g->jobs.size(); ++i) {
      const GenJob& j = *g->jobs[i];
      n_prompt += j.prompt.size();
      n_cached += j.n_cached;
      n_generated += j.n_generated;
      if (i == 0) queue_ms = j.queue_ms;  // the request's wait for its first choice
      prompt_ms += j.prompt_ms;
      gen_ms += j.gen_ms;
      n_reasoning += g->sessions[i]->reasoning_tokens;
      parse_failures += g->sessions[i]->tool_call_parse_failures;
    }
    log::info("request ", rid, " ", path, " -> ", status, ": ", n_prompt, " prompt tokens (", n_cached,
              " cached), ", n_generated, " generated", g->jobs.size() > 1 ? " in " + std::to_string(g->jobs.size()) + " choices" : "",
              ", queue ", static_cast<int>(queue_ms), " ms, prefill ", static_cast<int>(prompt_ms), " ms, decode ",
              static_cast<int>(gen_ms), " ms");
    metrics_.request_done(status, g->endpoint);
    metrics_.add_tool_call_parse_failures(parse_failures);
    metrics_.add_prompt_tokens(static_cast<int64_t>(n_prompt), n_cached);
    metrics_.add_generated_tokens(n_generated, n_reasoning);
    metrics_.observe_e2e(std::chrono::duration<double>(Clock::now() - g->arrival).count());
  };

  if (!g->info.stream) {
    bool finished = pump([](size_t, auto&, auto&, bool) { return true; }, nullptr);
    in_flight_.fetch_sub(1);
    if (!finished) {
      record(499);
      res.status = 499;
      res.close = true;
      return;
    }
    if (const GenJob* f = failure()) {
      if (f->finish == FinishReason::error) {
        record(500);
        throw ApiError(500, "server_error", f->error_code, "", "generation failed: " + f->error);
      }
      record(503);
      ApiError e(503, "unavailable_error", "shutting_down", "", "the server shut down before the request finished");
      e.retry_after = 1;
      throw e;
    }
    record(200);
    if (g->api) {
      send_json(res, 200, g->api->response(gen_result(*g->sessions[0], *g->jobs[0])));
      return;
    }
    const std::vector<ChoiceOut> choices = g->choices();
    send_json(res, 200, g->info.chat ? chat_response(g->info, choices, *m.tokenizer)
                                     : completion_response(g->info, choices, *m.tokenizer));
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.content_type = "text/event-stream";
  const Tokenizer* tok = m.tokenizer.get();
  res.stream = [g, pump, failure, record, cancel_all, tok](StreamSink& sink) {
    // One formatter per choice; chunks of the choices interleave in the order their tokens arrive.
    std::vector<StreamFormatter> fmt;
    for (size_t i = 0; i < g->jobs.size(); ++i) fmt.emplace_back(g->info, *tok, static_cast<int>(i));
    ApiFormat* api = g->api.get();
    auto put = [&sink](const std::string& s) { return s.empty() || sink.write(s); };
    bool ok = true;
    if (api) ok = put(api->start());
    for (size_t i = 0; ok && !api && i < fmt.size(); ++i) ok = put(fmt[i].start());
    if (ok) {
      ok = pump([&](size_t i, std::vector<OutEvent>& ev, std::vector<LogprobEntry>& lps, bool finished) {
                  if (api) return put(api->events(ev));
                  if (!put(fmt[i].events(ev, lps))) return false;
                  const GenJob& j = *g->jobs[i];
                  const bool failed = j.finish == FinishReason::error || j.finish == FinishReason::cancelled;
                  return !finished || failed || put(fmt[i].finish_choice(*g->sessions[i], j));
                },
                [&] { return put(api ? api->ping() : ": ping\n\n"); });
    }
    if (!ok) {
      cancel_all();  // (pump has already; not when the first write failed)
      record(499);
      return false;
    }
    bool wrote = true;
    if (const GenJob* f = failure()) {
      const bool error = f->finish == FinishReason::error;
      record(error ? 500 : 503);
      std::string msg = error ? "generation failed: " + f->error : "the server shut down before the request finished";
      std::string code = error ? f->error_code : "internal_error";
      wrote = put(api ? api->error(msg, code) : fmt[0].error(msg, code));
    } else {
      record(200);
      wrote = put(api ? api->finish(gen_result(*g->sessions[0], *g->jobs[0])) : fmt[0].usage_chunk(g->choices()));
    }
    if (api) return wrote;  // the Responses and Messages streams end with their own events
    return put("data: [DONE]\n\n") && wrote;
  };
  res.stream_done = [this, g, cancel_all](bool ran) {
    if (!ran) cancel_all();  // headers never went out: the stream did not run
    in_flight_.fetch_sub(1);
  };
}

}  // namespace lily::server
