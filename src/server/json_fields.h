// Reading request bodies field by field, with errors that name the field (`param` is its path, e.g.
// `input[2].call_id`): shared by the chat, Responses and Messages request parsers.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace lily::server {

// A present, non-null member, or nullptr. OpenAI SDKs send null for "not set".
inline const nlohmann::ordered_json* member(const nlohmann::ordered_json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// obj[key] as a string; a missing key is a 400 when `required`, else "".
inline std::string str_field(const nlohmann::ordered_json& obj, const char* key, const std::string& param,
                             bool required = true) {
  const nlohmann::ordered_json* v = member(obj, key);
  if (!v) {
    if (required) throw invalid_value(param + "." + key, "'" + param + "." + key + "' is required");
    return {};
  }
  if (!v->is_string()) throw invalid_value(param + "." + key, "'" + param + "." + key + "' must be a string");
  return v->get<std::string>();
}

}  // namespace lily::server
