// The OpenAI error object (docs/api.md §7): every caller mistake becomes an ApiError thrown in the HTTP layer and
// answered as {"error": {"message", "type", "param", "code"}} with the matching 4xx status.
#pragma once
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace lily::server {

struct ApiError : std::runtime_error {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;          // empty -> null
  std::string param;         // empty -> null
  nlohmann::json extra;      // extra members of the error object (n_prompt_tokens, n_ctx)
  int retry_after = 0;       // seconds; > 0 adds a Retry-After header

  ApiError(int status_, std::string type_, std::string code_, std::string param_, const std::string& message)
      : std::runtime_error(message), status(status_), type(std::move(type_)), code(std::move(code_)),
        param(std::move(param_)) {}

  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json e = {{"message", what()},
                        {"type", type},
                        {"param", param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param)},
                        {"code", code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code)}};
    if (extra.is_object())
      for (auto& [k, v] : extra.items()) e[k] = v;
    return {{"error", e}};
  }
};

// 400 invalid_request_error naming the field.
inline ApiError invalid_value(const std::string& param, const std::string& message,
                              const std::string& code = "invalid_value") {
  return ApiError(400, "invalid_request_error", code, param, message);
}

inline ApiError not_supported(const std::string& param, const std::string& message) {
  return ApiError(400, "not_supported_error", "unsupported_feature", param, message);
}

}  // namespace lily::server
