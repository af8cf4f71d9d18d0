// `lily chat`: an interactive terminal chat against a running `lily serve` (or any OpenAI-compatible server),
// or against a model directory (--model DIR / --demo: starts `lily serve` on a free loopback port for the
// session and stops it at the end).
// Streams the reply (reasoning dimmed), keeps the conversation (reasoning is sent back so the server's prefix
// cache reuses the previous turns), and prints tokens/s after each reply. Commands: /reset, /system TEXT,
// /think on|off, /quit. A line ending in '\' continues the message on the next line; """ starts and ends a
// multi-line block.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "server/http_client.h"
#include "util/check.h"

namespace lily::cli {
namespace {

using ojson = nlohmann::ordered_json;

struct ChatArgs {
  std::string url = "http://127.0.0.1:8080";
  std::string model_dir;  // non-empty: serve this directory for the session
  bool demo = false;      // serve the demo model for the session
  std::string api_key;
  std::string system;
  int max_tokens = 4096;
  bool no_think = false;
};

// Reads one user message (multi-line rules above). False at end of input.
bool read_message(std::string& out) {
  out.clear();
  std::string line;
  bool block = false;
  for (;;) {
    std::fputs(out.empty() && !block ? "\n\x1b[1m> \x1b[0m" : "\x1b[1m. \x1b[0m", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) return !out.empty();
    if (line == "\"\"\"") {
      if (block) return true;
      block = true;
      continue;
    }
    if (block) {
      out += line + "\n";
      continue;
    }
    if (!line.empty() && line.back() == '\\') {
      out += line.substr(0, line.size() - 1) + "\n";
      continue;
    }
    out += line;
    return true;
  }
}

int run_chat(const ChatArgs& a) {
  server::HttpClient cli = server::HttpClient::from_url(a.url);
  cli.set_timeout(3600);
  cli.set_connect_timeout(5);
  server::HttpHeaders headers;
  if (!a.api_key.empty()) headers.emplace_back("Authorization", "Bearer " + a.api_key);
  std::string why;
  auto models = cli.send("GET", "/v1/models", headers, "", {}, &why);
  if (!models || models->status != 200) {
    std::fprintf(stderr, "lily chat: no server at %s (%s)\n", a.url.c_str(),
                 models ? ("HTTP " + std::to_string(models->status)).c_str() : why.c_str());
    return 1;
  }
  auto mj = ojson::parse(models->body, nullptr, false);
  std::string model = mj.is_object() && !mj["data"].empty() ? mj["data"][0].value("id", "model") : "model";
  bool think = !a.no_think;
  std::string system = a.system;
  ojson history = ojson::array();
  const bool tty = isatty(STDOUT_FILENO);
  const char* dim = tty ? "\x1b[2m" : "";
  const char* reset = tty ? "\x1b[0m" : "";
  std::printf("lily chat with %s at %s — /reset, /system TEXT, /think on|off, /quit\n", model.c_str(), a.url.c_str());

  std::string msg;
  while (read_message(msg)) {
    if (msg.empty()) continue;
    if (msg == "/quit" || msg == "/exit") break;
    if (msg == "/reset") { history = ojson::array(); std::printf("(conversation cleared)\n"); continue; }
    if (msg.rfind("/system", 0) == 0) {
      system = msg.size() > 8 ? msg.substr(8) : "";
      history = ojson::array();
      std::printf("(system prompt %s; conversation cleared)\n", system.empty() ? "removed" : "set");
      continue;
    }
    if (msg == "/think on" || msg == "/think off") {
      think = msg == "/think on";
      std::printf("(thinking %s)\n", think ? "on" : "off");
      continue;
    }
    history.push_back({{"role", "user"}, {"content", msg}});
    ojson messages = ojson::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    for (auto& m : history) messages.push_back(m);
    ojson body = {{"model", model}, {"messages", messages}, {"stream", true}, {"max_tokens", a.max_tokens},
                  {"stream_options", {{"include_usage", true}}},
                  {"chat_template_kwargs", {{"enable_thinking", think}}}};
    std::string reasoning, content, pending, error;
    ojson usage;
    bool in_reasoning = false;
    auto t0 = std::chrono::steady_clock::now();
    double ttft = -1;
    server::HttpHeaders req_headers = headers;
    req_headers.emplace_back("Content-Type", "application/json");
    auto on_data = [&](const std::string& piece) {
      pending += piece;
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        std::string ev = pending.substr(0, end);
        pending.erase(0, end + 2);
        if (ev.rfind("data: ", 0) != 0 || ev == "data: [DONE]") continue;
        auto j = ojson::parse(ev.substr(6), nullptr, false);
        if (!j.is_object()) continue;
        if (j.contains("error")) { error = j["error"].value("message", "error"); continue; }
        if (j.contains("usage") && j["usage"].is_object()) usage = j["usage"];
        if (!j.contains("choices") || j["choices"].empty()) continue;
        const ojson& delta = j["choices"][0]["delta"];
        if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string()) {
          std::string r = delta["reasoning_content"];
          if (ttft < 0) ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (!in_reasoning) { std::fputs(dim, stdout); in_reasoning = true; }
          std::fputs(r.c_str(), stdout);
          reasoning += r;
        }
        if (delta.contains("content") && delta["content"].is_string()) {
          std::string c = delta["content"];
          if (c.empty()) continue;
          if (ttft < 0) ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (in_reasoning) { std::printf("%s\n\n", reset); in_reasoning = false; }
          std::fputs(c.c_str(), stdout);
          content += c;
        }
        if (delta.contains("tool_calls")) std::fputs("[tool call]", stdout);
        std::fflush(stdout);
      }
      return true;
    };
    std::string err;
    auto res = cli.send("POST", "/v1/chat/completions", req_headers, body.dump(), on_data, &err);
    if (in_reasoning) std::fputs(reset, stdout);
    double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!res) {
      std::printf("\n(request failed: %s)\n", err.c_str());
      history.erase(history.end() - 1);
      continue;
    }
    if (res->status != 200) {
      auto j = ojson::parse(res->body, nullptr, false);
      std::printf("\n(HTTP %d: %s)\n", res->status,
                  j.is_object() && j.contains("error") ? j["error"].value("message", "").c_str() : res->body.c_str());
      history.erase(history.end() - 1);
      continue;
    }
    if (!error.empty()) std::printf("\n(server error: %s)\n", error.c_str());
    ojson reply = {{"role", "assistant"}, {"content", content}};
    if (!reasoning.empty()) reply["reasoning_content"] = reasoning;
    history.push_back(reply);
    if (usage.is_object()) {
      int n = usage.value("completion_tokens", 0);
      int cached = usage.contains("prompt_tokens_details") ? usage["prompt_tokens_details"].value("cached_tokens", 0) : 0;
      double gen_s = total - std::max(0.0, ttft);
      std::printf("\n%s[%d tokens, %.1f tok/s, first token %.2f s, %d/%d prompt tokens cached]%s\n", dim, n,
                  gen_s > 0 && n > 1 ? (n - 1) / gen_s : 0.0, std::max(0.0, ttft), cached,
                  usage.value("prompt_tokens", 0), reset);
    } else {
      std::printf("\n");
    }
  }
  return 0;
}

// A free loopback port (the kernel picks one; the tiny window until the server binds it is acceptable here).
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  LILY_CHECK(fd >= 0, "chat: cannot open a socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  LILY_CHECK(ok, "chat: cannot find a free port");
  return ntohs(a.sin_port);
}

// Runs `lily serve` for a model directory (or --demo) on a free port, chats with it, then stops it.
int run_local(ChatArgs a) {
  const int port = free_port();
  const std::string log = "/tmp/lily-chat-serve-" + std::to_string(getpid()) + ".log";
  std::vector<std::string> args = {"/proc/self/exe", "serve", "--host", "127.0.0.1", "--port", std::to_string(port)};
  if (a.demo) args.push_back("--demo");
  else args.insert(args.end(), {"--model", a.model_dir});
  const pid_t pid = fork();
  LILY_CHECK(pid >= 0, "chat: cannot start the server");
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    if (f) dup2(fileno(stderr), STDOUT_FILENO);
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  std::fprintf(stderr, "lily chat: loading the model (server log: %s)...\n", log.c_str());
  a.url = "http://127.0.0.1:" + std::to_string(port);
  server::HttpClient cli = server::HttpClient::from_url(a.url);
  cli.set_timeout(2);
  bool ready = false;
  for (int i = 0; i < 6000 && !ready; ++i) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) break;  // the server exited: its log says why
    auto r = cli.get("/health");
    ready = r && r->status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int rc = 1;
  if (ready) rc = run_chat(a);
  else std::fprintf(stderr, "lily chat: the server did not start; see %s\n", log.c_str());
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  return rc;
}

CommandRegistrar reg({"chat", "Interactive terminal chat (a running server, or --model DIR / --demo)", [](CLI::App& sub) {
                        auto a = std::make_shared<ChatArgs>();
                        auto* url = sub.add_option("--url", a->url, "Server URL")->capture_default_str();
                        auto* model = sub.add_option("--model,-m", a->model_dir, "Serve this checkpoint directory for the session");
                        auto* demo = sub.add_flag("--demo", a->demo, "Serve the tiny demo model (output is noise)");
                        url->excludes(model)->excludes(demo);
                        model->excludes(demo);
                        sub.add_option("--api-key", a->api_key, "API key");
                        sub.add_option("--system", a->system, "System prompt");
                        sub.add_option("--max-tokens", a->max_tokens, "Reply length cap")->capture_default_str();
                        sub.add_flag("--no-think", a->no_think, "Start with thinking off");
                        return std::function<int()>([a] { return a->model_dir.empty() && !a->demo ? run_chat(*a) : run_local(*a); });
                      }});

}  // namespace
}  // namespace lily::cli
