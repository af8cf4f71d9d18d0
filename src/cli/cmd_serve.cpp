// `lily serve`: the OpenAI-compatible HTTP server. The listener starts first (so /health answers 503 while the
// weights load), then the model loads and a banner prints the URL. SIGTERM/SIGINT drain in-flight requests
// (up to --drain seconds) and exit 0; a second signal exits at once with status 1.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "cli/backend_select.h"
#include "cli/command.h"
#include "server/http_server.h"
#include "util/check.h"
#include "util/log.h"

namespace lily::cli {
namespace {

struct ServeArgs {
  std::string model;
  std::string alias;
  bool demo = false;
  int ctx = 0;
  long long cache_mib = 8192;
  bool no_prefix_cache = false;
  bool no_thinking = false;
  bool check_tensors = false;
  std::string device = "auto";
  int gpu = -1;                 // --gpu: CUDA ordinal; -1: not given
  server::ServerOptions opt;
};

void banner(const server::ServedModel& m, const server::ServerOptions& o, int port) {
  std::string url = "http://" + o.host + ":" + std::to_string(port);
  std::fprintf(stderr, "\n");
  if (m.demo) {
    std::fprintf(stderr,
                 "  ************************************************************************\n"
                 "  *  DEMO MODE: tiny model with RANDOM weights. Its output is NOISE.      *\n"
                 "  *  The API, streaming, tools plumbing and metrics are real; the text    *\n"
                 "  *  is not. Serve Qwen3.6-35B-A3B with --model DIR for real answers.     *\n"
                 "  ************************************************************************\n\n");
  }
  std::fprintf(stderr, "  lily serving %s\n", m.alias.c_str());
  std::fprintf(stderr, "    model    %s\n", m.dir.c_str());
  std::fprintf(stderr, "    backend  %s, context %d tokens, %.1f M parameters, %.1f MiB of weights\n",
               m.backend->name().c_str(), m.backend->max_context(), double(m.n_params) / 1e6,
               double(m.size_bytes) / (1 << 20));
  std::fprintf(stderr, "    batch    %d sequences at once, KV budget %s\n", m.batch ? m.batch->max_seqs() : 1,
               o.kv_tokens > 0 ? (std::to_string(o.kv_tokens) + " tokens").c_str() : "every sequence its full context");
  std::fprintf(stderr, "    queue    %d waiting requests, prefix cache %s\n", o.queue,
               o.prefix_cache ? (std::to_string(o.cache_bytes >> 20) + " MiB").c_str() : "off");
  std::fprintf(stderr, "    url      %s/v1   (OpenAI base_url)%s\n", url.c_str(),
               o.api_key.empty() ? "" : ", API key required");
  std::fprintf(stderr, "\n  try:\n    curl %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
               "      -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n"
               "    lily chat --url %s\n\n",
               url.c_str(), m.alias.c_str(), url.c_str());
}

int run_serve(ServeArgs a) {
  // Signals are taken by one thread with sigwait; block them before any other thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::string dir = a.model;
  if (a.demo && !dir.empty()) fail("--demo and --model are exclusive");
  if (!a.demo && dir.empty()) {
    auto found = server::find_cached_model();
    if (!found) {
      std::fprintf(stderr, "lily serve: %s\n", server::how_to_get_model().c_str());
      return 1;
    }
    dir = *found;
    log::info("using the cached checkpoint ", dir);
  }
  if (a.gpu >= 0) {
    // One replica per GPU (docs/deploy.md): before any thread or CUDA call, so the whole process sees one device.
    if (a.device == "cpu") fail("--gpu ", a.gpu, " and --device cpu are exclusive");
    log::info("--gpu ", a.gpu, ": CUDA_VISIBLE_DEVICES=", cli::pin_gpu(a.gpu));
    a.device = "cuda";  // never fall back to the CPU when a GPU was named
  }
  a.opt.prefix_cache = !a.no_prefix_cache;
  a.opt.cache_bytes = static_cast<size_t>(std::max(0LL, a.cache_mib)) << 20;
  a.opt.default_thinking = !a.no_thinking;

  server::HttpServer srv(a.opt);
  srv.bind();
  srv.start();
  const int port = srv.port();
  std::fprintf(stderr, "lily: listening on http://%s:%d (loading the model; /health is 503 until ready)\n",
               a.opt.host.c_str(), port);

  std::mutex mu;
  std::condition_variable cv;
  bool signalled = false, loaded = false;
  std::string load_error;
  std::thread sig_thread([&] {
    int sig = 0;
    sigwait(&set, &sig);
    {
      std::lock_guard l(mu);
      signalled = true;
    }
    cv.notify_all();
    sigwait(&set, &sig);
    std::fprintf(stderr, "lily: second signal, exiting now\n");
    _exit(1);
  });
  sig_thread.detach();

  std::thread loader([&] {
    std::unique_ptr<server::ServedModel> m;
    std::string err;
    try {
      std::string d = a.demo ? server::make_demo_model() : dir;
      std::string alias = !a.alias.empty() ? a.alias : a.demo ? "lily-demo-noise" : "qwen3.6-35b-a3b";
      const std::string device = a.device;
      LoadOptions load;
      load.check_tensors = a.check_tensors;
      m = server::load_served_model(
          d, a.ctx, alias, [device](const Model& model, int ctx) { return make_device_backend(model, device, ctx); },
          load, a.opt.max_seqs, make_device_batch_backend);
      m->demo = a.demo;
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (m) {
      try {
        const server::ServedModel* shown = m.get();
        srv.set_model(std::move(m));  // the engine: checks its options against the model (e.g. --kv-tokens)
        banner(*shown, a.opt, port);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    {
      std::lock_guard l(mu);
      loaded = true;
      load_error = err;
    }
    cv.notify_all();
  });

  std::unique_lock l(mu);
  cv.wait(l, [&] { return signalled || (loaded && !load_error.empty()); });
  if (!signalled) {
    l.unlock();
    loader.join();
    std::fprintf(stderr, "lily serve: error: %s\n", load_error.c_str());
    srv.shutdown();
    return 1;
  }
  bool still_loading = !loaded;
  l.unlock();
  std::fprintf(stderr, "lily: shutting down (draining for up to %.0f s)\n", a.opt.drain_s);
  if (still_loading) {
    srv.shutdown();
    std::fflush(stderr);
    _exit(0);  // the loader cannot be interrupted; nothing is in flight
  }
  loader.join();
  srv.shutdown();
  std::fprintf(stderr, "lily: stopped\n");
  return 0;
}

CommandRegistrar reg({"serve", "Serve the model over an OpenAI-compatible HTTP API", [](CLI::App& sub) {
                        auto a = std::make_shared<ServeArgs>();
                        sub.add_option("--model,-m", a->model, "Checkpoint directory (default: the HF cache)");
                        sub.add_flag("--demo", a->demo, "Serve a tiny random-weight model (output is noise)");
                        sub.add_option("--host", a->opt.host, "Address to bind")->capture_default_str();
                        sub.add_option("--port,-p", a->opt.port, "Port (0: any free port)")->capture_default_str();
                        sub.add_option("--api-key", a->opt.api_key, "Require this key (Bearer or X-Api-Key)");
                        sub.add_option("--ctx,--ctx-size,-c", a->ctx, "Context length in tokens (default: model max, <= 32768)");
                        sub.add_option("--cors", a->opt.cors_origin, "Allowed CORS origin (e.g. '*')");
                        sub.add_option("--queue", a->opt.queue, "Waiting requests before 429")->capture_default_str()
                            ->check(CLI::Range(0, 4096));
                        sub.add_option("--max-seqs", a->opt.max_seqs,
                                       "Sequences generated at once (continuous batching; 0: 8 on the CPU backend, 1 on "
                                       "CUDA, where more runs the batched step: more total tok/s from ~16 clients, "
                                       "less per client; docs/batching.md)")
                            ->capture_default_str()->check(CLI::Range(0, 1024));
                        sub.add_option("--kv-tokens", a->opt.kv_tokens,
                                       "KV-cache budget in tokens shared by all sequences (0: every sequence its full "
                                       "context); a sequence that needs more waits, or is preempted and recomputed")
                            ->capture_default_str()->check(CLI::Range(0, 1 << 30));
                        sub.add_option("--timeout", a->opt.timeout_s, "Per-request time limit in seconds (0: none)")
                            ->capture_default_str()->check(CLI::Range(0.0, 1e7));
                        sub.add_option("--drain", a->opt.drain_s, "Seconds to finish in-flight work on SIGTERM")
                            ->capture_default_str()->check(CLI::Range(0.0, 3600.0));
                        sub.add_option("--max-body", a->opt.max_body, "Request body cap in bytes")->capture_default_str();
                        sub.add_option("--max-tokens-default", a->opt.max_tokens_cap,
                                       "max_tokens when a request sets none")->capture_default_str()
                            ->check(CLI::Range(1, 1 << 30));
                        sub.add_option("--alias", a->alias, "Model id shown to clients");
                        sub.add_option("--cache-mib", a->cache_mib,
                                       "Prefix-cache memory cap (MiB; on the CUDA backend in GPU memory while it has room)")
                            ->capture_default_str();
                        sub.add_flag("--no-prefix-cache", a->no_prefix_cache, "Always prefill the whole prompt");
                        sub.add_flag("--no-thinking", a->no_thinking, "enable_thinking=false unless a request says otherwise");
                        sub.add_flag("--check-tensors", a->check_tensors,
                                     "Scan the weights for NaN / Inf at load (refuse a corrupt checkpoint)");
                        add_device_option(sub, a->device);
                        sub.add_option("--gpu", a->gpu,
                                       "Run on this CUDA device only (one replica per GPU; indexes CUDA_VISIBLE_DEVICES "
                                       "when set)")->check(CLI::NonNegativeNumber);
                        sub.add_option("--http-threads", a->opt.http_threads,
                                       "Worker threads for tokenising and generation requests (0: queue + max-seqs (at least 8) + 32)")
                            ->check(CLI::Range(0, 4096));
                        sub.add_option("--io-threads", a->opt.io_threads, "Threads running the HTTP sockets")
                            ->capture_default_str()->check(CLI::Range(1, 64));
                        sub.add_option("--max-connections", a->opt.max_connections,
                                       "Open client connections before new ones get 503")
                            ->capture_default_str()->check(CLI::Range(1, 1 << 20));
                        sub.add_option("--header-timeout", a->opt.header_timeout_s,
                                       "Seconds a client has to send a whole request header")
                            ->capture_default_str()->check(CLI::Range(0.1, 3600.0));
                        sub.add_option("--read-timeout", a->opt.read_timeout_s,
                                       "Seconds each read of a request body may wait")
                            ->capture_default_str()->check(CLI::Range(0.1, 3600.0));
                        sub.add_option("--allowed-hosts", a->opt.allowed_hosts,
                                       "Host header names accepted, comma-separated ('*': any; default: localhost, "
                                       "127.0.0.1, [::1] when bound to loopback without --api-key, else any)")
                            ->delimiter(',');
                        return std::function<int()>([a] { return run_serve(*a); });
                      }});

}  // namespace
}  // namespace lily::cli
