// The OpenAI-compatible HTTP server (api.md) on cpp-httplib: routing, auth, CORS, request validation, prompt
// rendering and tokenisation on the HTTP threads; generation on the one engine thread (engine.h); SSE and JSON
// formatting back on the HTTP threads. The listener starts before the model loads so /health reports 503
// "loading"; shutdown() drains in-flight work within a deadline (api.md §10.1 row 8).
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "server/engine.h"
#include "server/metrics.h"
#include "server/served_model.h"

namespace httplib { class Server; struct Request; struct Response; }

namespace lily::server {

struct ChatRequest;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                          // 0: any free port (see HttpServer::port)
  std::string api_key;                      // empty: no auth
  std::string cors_origin;                  // empty: no CORS headers
  int queue = 16;                           // waiting requests before 429
  double timeout_s = 600;                   // per-request generation time limit
  size_t max_body = size_t{8} << 20;        // request body cap (413 above)
  int max_tokens_cap = 32768;               // default max_tokens when the request sets none
  double drain_s = 30;                      // SIGTERM drain deadline
  bool prefix_cache = true;
  size_t cache_bytes = size_t{8} << 30;
  int http_threads = 0;                     // 0: queue + 32
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

  void routes();
  void handle_chat(const httplib::Request& req, httplib::Response& res);
  void handle_responses(const httplib::Request& req, httplib::Response& res);   // POST /v1/responses
  void handle_messages(const httplib::Request& req, httplib::Response& res);    // POST /v1/messages[/count_tokens]
  void run_chat(const ChatRequest& cr, std::shared_ptr<Gen> g, const httplib::Request& req,
                httplib::Response& res);
  void handle_completion(const httplib::Request& req, httplib::Response& res);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
  void handle_apply_template(const httplib::Request& req, httplib::Response& res);
  void handle_models(const httplib::Request& req, httplib::Response& res);
  void submit_and_respond(std::shared_ptr<Gen> g, const httplib::Request& req, httplib::Response& res);
  ServedModel& ready_model();  // throws 503 while loading / draining

  ServerOptions opt_;
  Metrics metrics_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listen_thread_;
  int port_ = 0;
  int listen_fd_ = -1;  // the listening socket (recorded when httplib creates it, for its backlog)
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
