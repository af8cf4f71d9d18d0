// config.json parsing: the published wrapper (tests/data; fields as in docs/model.md §1.1), an mlx-community
// style copy with quantization blocks, a bare text config, generation_config.json handling, and one
// rejection per missing or inconsistent field, each with its own message.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "model/config.h"
#include "model/model_stats.h"
#include "model/synth.h"
#include "util/check.h"
#include "util/safetensors.h"

namespace lily {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json published() {
  return read_json_file(std::string(LILY_SOURCE_DIR) + "/tests/data/qwen3.6-35b-a3b.config.json");
}

json mlx_quant_block() {
  json q = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"}};
  for (int i = 0; i < 40; ++i) {
    std::string L = "language_model.model.layers." + std::to_string(i) + ".mlp.";
    q[L + "gate"] = {{"group_size", 64}, {"bits", 8}};
    q[L + "shared_expert_gate"] = {{"group_size", 64}, {"bits", 8}};
  }
  return q;
}

// Expects parse_config to throw a lily::Error whose message contains `needle`.
void expect_error(const json& j, const std::string& needle) {
  try {
    parse_config(j, "cfg.json");
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what()
                                                                     << "\nexpected to contain: " << needle;
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
  }
}

TEST(Config, PublishedWrapper) {
  Config c = parse_config(published(), "config.json");
  EXPECT_EQ(c.model_type, "qwen3_5_moe");
  EXPECT_EQ(c.hidden, 2048);
  EXPECT_EQ(c.n_layers, 40);
  EXPECT_EQ(c.vocab, 248320);
  EXPECT_FLOAT_EQ(c.eps, 1e-6f);
  EXPECT_EQ(c.n_attention_layers(), 10);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(c.is_attention(i), (i + 1) % 4 == 0) << i;
  EXPECT_EQ(c.full_attention_interval, 4);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.n_heads, 16);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.key_dim(), 2048);
  EXPECT_EQ(c.value_dim(), 4096);
  EXPECT_EQ(c.conv_dim(), 8192);
  EXPECT_EQ(c.q_proj_rows(), 8192);
  EXPECT_EQ(c.conv_kernel, 4);
  EXPECT_EQ(c.n_experts, 256);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_EQ(c.moe_ffn, 512);
  EXPECT_EQ(c.shared_ffn, 512);
  EXPECT_EQ(c.bos_token_id, 248044);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{248044});
  EXPECT_FALSE(c.quant.present);
  EXPECT_FALSE(c.quant.for_module("language_model.model.layers.0.mlp.gate").quantized);
}

TEST(Config, MlxQuantizationBlock) {
  json j = published();
  j["quantization"] = mlx_quant_block();
  j["quantization_config"] = mlx_quant_block();
  j["quantization"]["language_model.model.layers.2.linear_attn.in_proj_a"] = false;
  j["quantization_config"]["language_model.model.layers.2.linear_attn.in_proj_a"] = false;
  Config c = parse_config(j, "config.json");
  ASSERT_TRUE(c.quant.present);
  QuantSpec g = c.quant.for_module("language_model.model.layers.7.mlp.gate");
  EXPECT_TRUE(g.quantized);
  EXPECT_EQ(g.bits, 8);
  EXPECT_EQ(g.group_size, 64);
  EXPECT_EQ(c.quant.for_module("language_model.model.layers.39.mlp.shared_expert_gate").bits, 8);
  QuantSpec e = c.quant.for_module("language_model.model.layers.7.mlp.switch_mlp.up_proj");
  EXPECT_TRUE(e.quantized);
  EXPECT_EQ(e.bits, 4);
  EXPECT_FALSE(c.quant.for_module("language_model.model.layers.2.linear_attn.in_proj_a").quantized);
  // Older MLX omits "mode"; only quantization_config present is also accepted.
  json k = published();
  json q = mlx_quant_block();
  q.erase("mode");
  k["quantization_config"] = q;
  EXPECT_EQ(parse_config(k, "config.json").quant.for_module("x").bits, 4);
}

TEST(Config, BareTextConfig) {
  json t = published()["text_config"];
  Config c = parse_config(t, "config.json");
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.n_layers, 40);
  EXPECT_EQ(c.rope_dim, 64);
  // Schedule from layer_types alone, and from the interval alone.
  json a = t;
  a.erase("full_attention_interval");
  EXPECT_EQ(parse_config(a, "c").full_attention_interval, 4);
  json b = t;
  b.erase("layer_types");
  EXPECT_EQ(parse_config(b, "c").n_attention_layers(), 10);
  // Top-level rope fields without rope_parameters.
  json r = t;
  r.erase("rope_parameters");
  r["rope_theta"] = 10000000;
  EXPECT_DOUBLE_EQ(parse_config(r, "c").rope_theta, 1e7);
}

TEST(Config, RejectsEachBadField) {
  auto text = [](auto edit) {
    json j = published();
    edit(j["text_config"]);
    return j;
  };
  expect_error(text([](json& t) { t.erase("hidden_size"); }), "missing field text_config.hidden_size");
  expect_error(text([](json& t) { t.erase("rms_norm_eps"); }), "missing field text_config.rms_norm_eps");
  expect_error(text([](json& t) { t.erase("num_experts_per_tok"); }), "missing field text_config.num_experts_per_tok");
  expect_error(text([](json& t) { t["hidden_size"] = "2048"; }), "text_config.hidden_size must be an integer");
  expect_error(text([](json& t) { t["num_hidden_layers"] = 0; }), "text_config.num_hidden_layers = 0 is out of range");
  expect_error(text([](json& t) { t["model_type"] = "qwen3_next"; }), "text_config.model_type");
  expect_error(text([](json& t) { t["num_hidden_layers"] = 39; }), "layer_types has 40 entries but num_hidden_layers = 39");
  expect_error(text([](json& t) { t["layer_types"][2] = "full_attention"; }),
               "layer_types[2] = \"full_attention\" disagrees with full_attention_interval = 4");
  expect_error(text([](json& t) { t["layer_types"][5] = "sliding_attention"; }), "layer_types[5]");
  expect_error(text([](json& t) {
                 t.erase("layer_types");
                 t.erase("full_attention_interval");
               }),
               "missing field text_config.layer_types");
  expect_error(text([](json& t) { t["num_key_value_heads"] = 3; }),
               "num_attention_heads = 16 is not a multiple of num_key_value_heads = 3");
  expect_error(text([](json& t) { t["linear_num_value_heads"] = 24; t["linear_num_key_heads"] = 16; }),
               "linear_num_value_heads = 24 is not a multiple of linear_num_key_heads = 16");
  expect_error(text([](json& t) { t["rope_parameters"].erase("rope_theta"); }),
               "missing field text_config.rope_parameters.rope_theta");
  expect_error(text([](json& t) { t["rope_parameters"].erase("partial_rotary_factor"); }),
               "missing field text_config.rope_parameters.partial_rotary_factor");
  expect_error(text([](json& t) { t["partial_rotary_factor"] = 0.5; }),
               "partial_rotary_factor = 0.5 disagrees with text_config.rope_parameters.partial_rotary_factor");
  expect_error(text([](json& t) { t["rope_theta"] = 100000; }), "rope_theta = 100000 disagrees");
  expect_error(text([](json& t) {
                 t.erase("rope_parameters");
                 t.erase("partial_rotary_factor");
               }),
               "missing field text_config.rope_theta");
  expect_error(text([](json& t) {
                 t["partial_rotary_factor"] = 0.3;
                 t["rope_parameters"]["partial_rotary_factor"] = 0.3;
               }),
               "must be a positive even integer");
  expect_error(text([](json& t) { t["rope_parameters"]["rope_type"] = "yarn"; }), "rope_type = \"yarn\" is not supported");
  expect_error(text([](json& t) { t["attn_output_gate"] = false; }), "attn_output_gate must be true");
  expect_error(text([](json& t) { t.erase("attn_output_gate"); }), "missing field text_config.attn_output_gate");
  expect_error(text([](json& t) { t["hidden_act"] = "gelu"; }), "hidden_act must be \"silu\"");
  expect_error(text([](json& t) { t["attention_bias"] = true; }), "attention_bias = true is not supported");
  expect_error(text([](json& t) { t["num_experts_per_tok"] = 300; }), "num_experts_per_tok = 300 exceeds num_experts");
  expect_error(text([](json& t) { t["mlp_only_layers"] = {3}; }), "mlp_only_layers must be empty");
  expect_error(text([](json& t) { t["tie_word_embeddings"] = true; }),
               "tie_word_embeddings disagrees with text_config.tie_word_embeddings");
  expect_error(text([](json& t) { t["eos_token_id"] = -5; }), "eos_token_id");

  json top = published();
  top["model_type"] = "qwen3_moe";
  expect_error(top, "model_type = \"qwen3_moe\" is not this architecture");
  json nt = published();
  nt.erase("text_config");
  expect_error(nt, "missing field text_config");
  json q1 = published();
  q1["quantization"] = mlx_quant_block();
  q1["quantization"]["mode"] = "mxfp4";
  expect_error(q1, "quantization.mode = \"mxfp4\" is not supported");
  json q2 = published();
  q2["quantization"] = {{"group_size", 64}, {"bits", 3}};
  expect_error(q2, "quantization.bits = 3 is not supported");
  json q3 = published();
  q3["quantization"] = mlx_quant_block();
  q3["quantization_config"] = mlx_quant_block();
  q3["quantization_config"]["bits"] = 8;
  expect_error(q3, "quantization_config differs from quantization");
  json q4 = published();
  q4["quantization"] = {{"group_size", 64}};
  expect_error(q4, "missing field quantization.bits");
  json q5 = published();
  q5["quantization"] = mlx_quant_block();
  q5["quantization"]["language_model.model.layers.0.mlp.gate"] = true;
  expect_error(q5, "language_model.model.layers.0.mlp.gate = true is not a quantization spec");
}

// Sizes beyond the bounds are refused by name before anything is sized from them (a 1e9-layer schedule would
// allocate gigabytes; head_dim 1e9 would overflow the expected q_proj rows to a negative number).
TEST(Config, RejectsSizesBeyondBounds) {
  auto text = [](auto edit) {
    json j = published();
    edit(j["text_config"]);
    return j;
  };
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(text([](json& t) {
                 t.erase("layer_types");
                 t["num_hidden_layers"] = 1000000000;
               }),
               "text_config.num_hidden_layers = 1000000000 is out of range [1, 1024]");
  expect_error(text([](json& t) { t["head_dim"] = 1000000000; }),
               "text_config.head_dim = 1000000000 is out of range [1, 4096]");
  expect_error(text([](json& t) { t["vocab_size"] = 2147483647; }), "text_config.vocab_size = 2147483647 is out of range");
  expect_error(text([](json& t) { t["vocab_size"] = (1 << 24) + 1; }), "text_config.vocab_size = 16777217 is out of range");
  expect_error(text([](json& t) { t["hidden_size"] = 1 << 20; }), "text_config.hidden_size = 1048576 is out of range");
  expect_error(text([](json& t) { t["num_experts"] = 100000; }), "text_config.num_experts = 100000 is out of range");
  expect_error(text([](json& t) { t["moe_intermediate_size"] = 1 << 30; }), "text_config.moe_intermediate_size");
  expect_error(text([](json& t) { t["shared_expert_intermediate_size"] = 1 << 30; }),
               "text_config.shared_expert_intermediate_size");
  expect_error(text([](json& t) { t["num_attention_heads"] = 1 << 20; }), "text_config.num_attention_heads");
  expect_error(text([](json& t) { t["linear_key_head_dim"] = 1 << 20; }), "text_config.linear_key_head_dim");
  expect_error(text([](json& t) { t["linear_conv_kernel_dim"] = 1000; }), "text_config.linear_conv_kernel_dim");
  expect_error(text([](json& t) { t["max_position_embeddings"] = 2000000000; }),
               "text_config.max_position_embeddings = 2000000000 is out of range");
  expect_error(text([](json& t) { t["num_hidden_layers"] = 18446744073709551615ull; }),
               "text_config.num_hidden_layers = 18446744073709551615 is out of range");
  expect_error(text([](json& t) { t["head_dim"] = -4; }), "text_config.head_dim = -4 is out of range");
  expect_error(text([](json& t) { t["bos_token_id"] = 4000000000ll; }), "text_config.bos_token_id");
  expect_error(text([](json& t) { t["eos_token_id"] = std::vector<int>(257, 1); }),
               "text_config.eos_token_id has 257 entries (at most 256)");
  // Generous limit: the checks come before any size-dependent work, so this is milliseconds.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  // The largest accepted values still parse (the bounds are inclusive).
  json big = text([](json& t) {
    t.erase("layer_types");
    t["num_hidden_layers"] = 1024;
    t["head_dim"] = 4096;
    t["rope_parameters"]["partial_rotary_factor"] = 0.25;
  });
  Config c = parse_config(big, "c");
  EXPECT_EQ(c.n_layers, 1024);
  EXPECT_EQ(c.q_proj_rows(), 16 * 4096 * 2);
}

// A 1e9-layer config without layer_types is refused before the schedule is built: under an address-space limit
// of 1 GiB above what the process maps (the schedule alone would take 4 GB), the parse ends in the named error.
// Runs in the death-test child: exit 0 for the named error, 3 for bad_alloc.
[[noreturn]] void parse_huge_layers_under_limit() {
  json j = published();
  j["text_config"].erase("layer_types");
  j["text_config"]["num_hidden_layers"] = 1000000000;
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  const rlim_t cap = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + (rlim_t(1) << 30);
  const rlimit rl{cap, cap};
  setrlimit(RLIMIT_AS, &rl);
  try {
    parse_config(j, "cfg.json");
    _exit(1);
  } catch (const Error& e) {
    _exit(std::string(e.what()).find("num_hidden_layers = 1000000000 is out of range") != std::string::npos ? 0 : 2);
  } catch (const std::bad_alloc&) {
    _exit(3);
  }
}

TEST(Config, HugeLayerCountRefusedWithoutHugeAllocation) {
  EXPECT_EXIT(parse_huge_layers_under_limit(), ::testing::ExitedWithCode(0), "");
}

class ConfigDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(LILY_BINARY_DIR) / "test_tmp" / "config" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write("config.json", published().dump());
  }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  fs::path dir_;
};

TEST_F(ConfigDir, GenerationConfigEosList) {
  write("generation_config.json",
        R"({"bos_token_id": 248044, "eos_token_id": [248046, 248044], "temperature": 0.7, "top_k": 20, "top_p": 0.95})");
  Config c = load_config(dir_.string());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{248046, 248044}));
  EXPECT_FLOAT_EQ(c.gen_temperature, 0.7f);
  EXPECT_EQ(c.gen_top_k, 20);
  EXPECT_FLOAT_EQ(c.gen_top_p, 0.95f);
}

TEST_F(ConfigDir, GenerationConfigEosInt) {
  write("generation_config.json", R"({"eos_token_id": 248046})");
  EXPECT_EQ(load_config(dir_.string()).eos_token_ids, std::vector<int>{248046});
}

TEST_F(ConfigDir, FallsBackToTextConfigEos) {
  write("generation_config.json", R"({"temperature": 1.0})");
  Config c = load_config(dir_.string());
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{248044});
  EXPECT_EQ(c.gen_top_k, 0);
}

TEST_F(ConfigDir, RejectsEosOutsideVocab) {
  write("generation_config.json", R"({"eos_token_id": [248320]})");
  EXPECT_THROW(load_config(dir_.string()), Error);
}

TEST_F(ConfigDir, RejectsDuplicateKey) {
  write("config.json", R"({"model_type": "qwen3_5_moe", "model_type": "qwen3_5_moe"})");
  try {
    load_config(dir_.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate JSON key \"model_type\""), std::string::npos) << e.what();
  }
}

TEST(ParamCount, FullPresetMatchesSpec) {
  SynthOptions o;
  o.preset = "full";
  Config c = synth_config(o);
  ParamCounts p = count_parameters(c);
  EXPECT_EQ(p.gdn_mixer, 33718464);
  EXPECT_EQ(p.attn_mixer, 27263488);
  EXPECT_EQ(p.moe_block, 808978432);
  EXPECT_EQ(p.embed, 508559360);
  EXPECT_EQ(p.text_total, 34660610688);
  EXPECT_EQ(p.active, 2946429568);
  // The published config gives the same numbers.
  EXPECT_EQ(count_parameters(parse_config(published(), "c")).text_total, 34660610688);
}

}  // namespace
}  // namespace lily
