// Health probes for load balancers and orchestrators (docs/deploy.md): readiness (`/health`, `/v1/health`,
// `/health/ready`, `/readyz`: 200 only when the model is loaded and the server is not draining, else 503 with
// Retry-After) and liveness (`/health/live`, `/livez`: 200 while the process serves HTTP at all, whatever the
// state). A balancer routes on readiness; a supervisor restarts on liveness only, so a replica that is loading
// or draining is taken out of rotation but not killed.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace lily::server {

enum class Probe { ready, live };

// Every path the health routes serve (all GET, all open without the API key).
inline constexpr std::string_view kHealthPaths[] = {"/health", "/v1/health", "/health/ready", "/readyz",
                                                    "/health/live", "/livez"};

// The probe `path` asks for; nullopt when it is not a health path.
std::optional<Probe> health_probe(std::string_view path);

struct HealthReply {
  int status = 200;      // 200 or 503
  int retry_after = 0;   // seconds for the Retry-After header; 0: none
  std::string body;      // JSON
};

// The answer to `probe` for a server that is `ready` (model loaded) and maybe `draining` (SIGTERM received).
HealthReply health_reply(Probe probe, bool ready, bool draining);

}  // namespace lily::server
