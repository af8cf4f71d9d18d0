// `lily render --model DIR`: reads one OpenAI-style request body from stdin (messages, optional tools,
// add_generation_prompt (default true), chat_template_kwargs) and prints the prompt the model's chat template
// renders, byte-exact and nothing else. Needs only the directory's template files, not the weights.
#include <cstdio>
#include <iostream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "chat/template.h"
#include "cli/command.h"

namespace lily::cli {
namespace {

int run_render(const std::string& model_dir) {
  using json = nlohmann::ordered_json;
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  json body;
  try {
    body = json::parse(input);
  } catch (const json::exception& e) {
    lily::fail("stdin is not valid JSON: ", e.what());
  }
  if (!body.is_object()) lily::fail("stdin must hold one JSON object (an OpenAI request body)");
  if (!body.contains("messages")) lily::fail("request has no 'messages'");
  const json tools = body.contains("tools") ? body["tools"] : json();
  bool add_generation_prompt = true;
  if (body.contains("add_generation_prompt")) {
    if (!body["add_generation_prompt"].is_boolean()) lily::fail("'add_generation_prompt' must be a boolean");
    add_generation_prompt = body["add_generation_prompt"].get<bool>();
  }
  const json kwargs = body.contains("chat_template_kwargs") ? body["chat_template_kwargs"] : json::object();
  if (!kwargs.is_object()) lily::fail("'chat_template_kwargs' must be an object");
  auto tmpl = chat::ChatTemplate::load_from_dir(model_dir);
  std::string prompt = tmpl.render(chat::normalize_messages(body["messages"]), tools, add_generation_prompt, kwargs);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

CommandRegistrar reg({"render", "Render a chat request (JSON on stdin) with the model's chat template",
                      [](CLI::App& sub) {
                        auto dir = std::make_shared<std::string>();
                        sub.add_option("--model", *dir, "model directory (chat_template.jinja or tokenizer_config.json)")
                            ->required();
                        return std::function<int()>([dir] { return run_render(*dir); });
                      }});

}  // namespace
}  // namespace lily::cli
