// The OpenAI-compatible HTTP server (docs/api.md): routing, Host check, auth, CORS, request validation, prompt
// rendering and tokenisation on the HTTP worker threads; generation on the one engine thread (engine.h); SSE and
// JSON formatting back on the worker threads. Sockets, limits and framing are the transport's (http_transport.h).
// The listener starts before the model loads so /health reports 503 "loading"; shutdown() drains in-flight work
// within a deadline (docs/api.md §10.1 row 8).
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <vector>

#include "server/engine.h"
#include "server/http_message.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/served_model.h"

namespace lily::server {

struct ChatRequest;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                          // 0: any free port (see HttpServer::port)
  std::string api_key;                      // empty: no auth
  std::string cors_origin;                  // empty: no CORS headers
  int queue = 16;                           // waiting requests before 429
  int max_seqs = 0;                         // sequences batched at once (0: 8 on the CPU backend, 1 on CUDA)
  int kv_tokens = 0;                        // KV-cache budget in tokens for all sequences (0: each its full context)
  double timeout_s = 600;                   // per-request generation time limit
  size_t max_body = size_t{8} << 20;        // request body cap (413 above)
  int max_tokens_cap = 32768;               // default max_tokens when the request sets none
  double drain_s = 30;                      // SIGTERM drain deadline
  bool prefix_cache = true;
  size_t cache_bytes = size_t{8} << 30;
  int http_threads = 0;                     // workers for blocking handlers; 0: queue + max(max_seqs, 8) + 32
  int io_threads = 2;                       // threads running the sockets
  int max_connections = 512;                // open client connections (503 above)
  double header_timeout_s = 10;             // deadline for a whole request header
  double read_timeout_s = 30;               // deadline for each body read
  std::vector<std::string> allowed_hosts;   // Host header names allowed ("*": any); empty: the default (below)
  bool default_thinking = true;             // enable_thinking when the request does not say
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions opt);
  ~HttpServer();

  // Binds the listening socket; throws lily::Error when the address is unusable.
  void bind();
  int port() const { return port_; }
  // Serves on a background thread.
  void start();
  // Installs the loaded model and starts the engine: /health turns 200.
  void set_model(std::unique_ptr<ServedModel> model);
  // Refuses new work (503 shutting_down), lets running and queued requests finish until drain_s, cancels the
  // rest, then stops the listener. Idempotent; returns when done.
  void shutdown();

 private:
  struct Gen;  // one generation request in flight (defined in http_server.cpp)
  using Handler = void (HttpServer::*)(const HttpRequest&, HttpResponse&);
  struct Route {
    std::string method;  // "GET" / "POST"
    std::string path;    // exact path, or a prefix when prefix is set (the rest is req.path_param)
    bool prefix;
    Handler fn;
    bool blocking;       // may block (tokenising, generation): runs on a worker thread
  };

  void routes();
  bool on_header(HttpRequest& req, HttpResponse& res);  // Host, CORS, auth, routing, media type (io thread)
  void on_request(HttpRequest& req, HttpResponse& res); // the routed handler, errors as OpenAI error objects
  void decorate(const HttpRequest& req, HttpResponse& res);  // X-Request-Id, CORS on every response
  bool host_allowed(const std::string& host) const;
  void handle_health(const HttpRequest& req, HttpResponse& res);
  void handle_metrics(const HttpRequest& req, HttpResponse& res);
  void handle_chat(const HttpRequest& req, HttpResponse& res);
  void handle_responses(const HttpRequest& req, HttpResponse& res);   // POST /v1/responses
  void handle_messages(const HttpRequest& req, HttpResponse& res);    // POST /v1/messages[/count_tokens]
  void run_chat(const ChatRequest& cr, std::shared_ptr<Gen> g, const HttpRequest& req, HttpResponse& res);
  void handle_completion(const HttpRequest& req, HttpResponse& res);
  void handle_tokenize(const HttpRequest& req, HttpResponse& res);
  void handle_detokenize(const HttpRequest& req, HttpResponse& res);
  void handle_apply_template(const HttpRequest& req, HttpResponse& res);
  void handle_models(const HttpRequest& req, HttpResponse& res);
  void submit_and_respond(std::shared_ptr<Gen> g, const HttpRequest& req, HttpResponse& res);
  ServedModel& ready_model();  // throws 503 while loading / draining

  ServerOptions opt_;
  Metrics metrics_;
  std::vector<Route> routes_;
  std::vector<std::string> hosts_;  // allowed Host names (lower case, no port); empty: any
  std::unique_ptr<HttpTransport> http_;
  int port_ = 0;
  std::unique_ptr<ServedModel> model_;
  std::unique_ptr<Engine> engine_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};          // generation responses still being written
  std::mutex shutdown_mu_;
  bool shut_ = false;
  std::string fingerprint_;
};

}  // namespace lily::server
