// Health probe decisions (see health.h).
#include "server/health.h"

#include <nlohmann/json.hpp>

namespace lily::server {

std::optional<Probe> health_probe(std::string_view path) {
  if (path == "/health/live" || path == "/livez") return Probe::live;
  for (std::string_view p : kHealthPaths)
    if (p == path) return Probe::ready;
  return std::nullopt;
}

HealthReply health_reply(Probe probe, bool ready, bool draining) {
  const char* state = draining ? "draining" : ready ? "ready" : "loading";
  if (probe == Probe::live) return {200, 0, nlohmann::ordered_json{{"status", "ok"}, {"state", state}}.dump()};
  if (ready && !draining) return {200, 0, R"({"status":"ok"})"};
  // An OpenAI error object: balancers look at the status, clients and people at the message.
  const char* message = draining ? "Shutting down" : "Loading model";
  nlohmann::ordered_json body = {{"error", {{"code", 503}, {"message", message}, {"type", "unavailable_error"}}}};
  return {503, draining ? 1 : 5, body.dump()};
}

}  // namespace lily::server
