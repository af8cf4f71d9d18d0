// load_model rejections at the model level (docs/model.md §5, docs/api.md §10.1 #9-10): a tiny synthetic checkpoint
// is rewritten with one defect (wrong dtype, wrong shape, missing, unknown, mixed layouts, truncated, wrong
// quantization) and each load must fail with its own message naming the file / tensor, expected and actual.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <cstring>

#include "model/synth.h"
#include "model/tensor_check.h"
#include "model/weights.h"
#include "util/check.h"
#include "util/safetensors.h"

namespace lily {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Spec {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
  const uint8_t* src;  // nullptr: seeded bytes
};

class LoaderReject : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::path(LILY_BINARY_DIR) / "test_tmp" / "loader_reject";
    out_ = base_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(out_);
    fs::create_directories(out_);
  }
  // Synthesizes the source checkpoint (per test: ctest may run tests in parallel processes).
  fs::path source(CheckpointLayout layout) {
    fs::path d = out_.string() + "_src";
    fs::remove_all(d);
    SynthOptions o;
    o.layout = layout;
    o.seed = 99;
    o.threads = 2;
    synth_checkpoint(d.string(), o);
    return d;
  }
  // Copies the source checkpoint into out_, passing the tensor list through `edit`.
  void rewrite(CheckpointLayout layout, const std::function<void(std::vector<Spec>&)>& edit) {
    fs::path src = source(layout);
    for (const char* f : {"config.json", "generation_config.json"})
      fs::copy_file(src / f, out_ / f, fs::copy_options::overwrite_existing);
    TensorStore st = TensorStore::open_dir(src.string());
    std::vector<Spec> specs;
    for (const auto& n : st.names()) {
      const TensorView& v = st.get(n);
      specs.push_back({n, v.dtype, v.shape, v.data});
    }
    edit(specs);
    SafetensorsWriter w((out_ / "model.safetensors").string());
    for (const auto& s : specs) w.add(s.name, s.dtype, s.shape);
    w.write_header();
    std::mt19937 rng(5);
    for (const auto& s : specs) {
      size_t n = dtype_size(s.dtype);
      for (int64_t d : s.shape) n *= d;
      const TensorView* orig = st.find(s.name);
      if (s.src && (!orig || orig->nbytes == n)) {  // (a tensor added with data: its own bytes)
        w.write(s.src, n);
      } else {
        std::vector<uint8_t> bytes(n);
        for (auto& b : bytes) b = static_cast<uint8_t>(rng());
        w.write(bytes.data(), n);
      }
    }
    w.finish();
  }
  void expect_load_error(const std::vector<std::string>& needles, const LoadOptions& opt = {}) {
    try {
      load_model(out_.string(), opt);
      ADD_FAILURE() << "loaded; expected an error";
    } catch (const Error& e) {
      std::string m = e.what();
      for (const auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "message: " << m << "\nexpected: " << n;
    }
  }
  static Spec* find(std::vector<Spec>& s, const std::string& name) {
    for (auto& x : s)
      if (x.name == name) return &x;
    return nullptr;
  }
  fs::path base_, out_;
};

const std::string kHf = "model.language_model.layers.";
const std::string kMlx = "language_model.model.layers.";

TEST_F(LoaderReject, UnchangedCopyLoads) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>&) {});
  EXPECT_NO_THROW(load_model(out_.string()));
}

TEST_F(LoaderReject, WrongDtype) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>& s) {
    find(s, "model.language_model.embed_tokens.weight")->dtype = Dtype::F32;
  });
  expect_load_error({"model.safetensors", "tensor model.language_model.embed_tokens.weight",
                     "expected BF16 [512, 128], got F32 [512, 128]"});
}

TEST_F(LoaderReject, WrongShape) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>& s) {
    find(s, kHf + "3.self_attn.o_proj.weight")->shape = {128, 256};
  });
  expect_load_error({"tensor " + kHf + "3.self_attn.o_proj.weight", "expected BF16 [128, 128], got BF16 [128, 256]"});
}

TEST_F(LoaderReject, WrongFusedExpertShape) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>& s) {
    find(s, kHf + "0.mlp.experts.gate_up_proj")->shape = {8, 64, 128};
  });
  expect_load_error({kHf + "0.mlp.experts.gate_up_proj", "expected BF16 [8, 128, 128], got BF16 [8, 64, 128]"});
}

TEST_F(LoaderReject, MissingTensor) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>& s) {
    s.erase(std::remove_if(s.begin(), s.end(), [](const Spec& x) { return x.name == kHf + "1.linear_attn.dt_bias"; }),
            s.end());
  });
  expect_load_error({"tensor " + kHf + "1.linear_attn.dt_bias is missing (expected BF16 [4])"});
}

TEST_F(LoaderReject, MissingLmHead) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>& s) {
    s.erase(std::remove_if(s.begin(), s.end(), [](const Spec& x) { return x.name == "lm_head.weight"; }), s.end());
  });
  expect_load_error({"tensor lm_head.weight is missing"});
}

TEST_F(LoaderReject, UnknownTensor) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>& s) {
    s.push_back({kHf + "0.mlp.extra.weight", Dtype::BF16, {4, 4}, nullptr});
  });
  expect_load_error({"model.safetensors", "unknown tensor " + kHf + "0.mlp.extra.weight"});
}

TEST_F(LoaderReject, IgnoresVisionAndMtp) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>& s) {
    s.push_back({"model.visual.blocks.0.attn.qkv.weight", Dtype::BF16, {6, 4}, nullptr});
    s.push_back({"mtp.fc.weight", Dtype::BF16, {128, 256}, nullptr});
  });
  EXPECT_NO_THROW(load_model(out_.string()));
}

TEST_F(LoaderReject, MisalignedTensorsAreCopied) {
  // A 3-byte tensor first shifts every later tensor off its element alignment; the loader copies them.
  rewrite(CheckpointLayout::mlx_affine, [](std::vector<Spec>& s) {
    s.insert(s.begin(), Spec{"vision_tower.odd", Dtype::U8, {3}, nullptr});
  });
  Model a = load_model(out_.string());
  Model b = load_model((out_.string() + "_src"));
  const Mat& x = a.weights.layers[1].moe.experts_up[2];
  const Mat& y = b.weights.layers[1].moe.experts_up[2];
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data) % 4, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.scales) % 2, 0u);
  EXPECT_EQ(std::memcmp(x.data, y.data, x.rows * x.row_bytes()), 0);
  EXPECT_EQ(std::memcmp(x.scales, y.scales, x.rows * (x.cols / x.group_size) * 2), 0);
  EXPECT_EQ(a.weights.layers[0].gdn.A_log, b.weights.layers[0].gdn.A_log);
}

TEST_F(LoaderReject, MixedLayouts) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>& s) {
    s.push_back({"language_model.model.norm.weight", Dtype::BF16, {128}, nullptr});
  });
  expect_load_error({"mixes HF", "language_model.model.norm.weight"});
}

TEST_F(LoaderReject, MlxWrongQuantBits) {
  // Config says 8-bit for mlp.gate; store it as 4-bit ([E, H/8] words instead of [E, H/4]).
  rewrite(CheckpointLayout::mlx_affine, [](std::vector<Spec>& s) {
    find(s, kMlx + "2.mlp.gate.weight")->shape = {8, 16};
  });
  expect_load_error({"tensor " + kMlx + "2.mlp.gate.weight", "expected U32 [8, 32], got U32 [8, 16]"});
}

TEST_F(LoaderReject, MlxMissingScales) {
  rewrite(CheckpointLayout::mlx_affine, [](std::vector<Spec>& s) {
    s.erase(std::remove_if(s.begin(), s.end(),
                           [](const Spec& x) { return x.name == kMlx + "4.mlp.switch_mlp.down_proj.scales"; }),
            s.end());
  });
  expect_load_error({"tensor " + kMlx + "4.mlp.switch_mlp.down_proj.scales is missing (expected BF16 [8, 128, 1])"});
}

TEST_F(LoaderReject, MlxConvInHfOrientation) {
  rewrite(CheckpointLayout::mlx_affine, [](std::vector<Spec>& s) {
    find(s, kMlx + "0.linear_attn.conv1d.weight")->shape = {256, 1, 4};
  });
  expect_load_error({kMlx + "0.linear_attn.conv1d.weight", "expected BF16 [256, 4, 1], got BF16 [256, 1, 4]"});
}

TEST_F(LoaderReject, TruncatedFile) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>&) {});
  fs::path f = out_ / "model.safetensors";
  fs::resize_file(f, fs::file_size(f) - 3);
  expect_load_error({"model.safetensors", "file truncated"});
}

TEST_F(LoaderReject, MissingConfig) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>&) {});
  fs::remove(out_ / "config.json");
  expect_load_error({"config.json: not found"});
}

// config.json sizes beyond the loader's bounds are refused by name, from the config alone: nothing is sized from
// them (a 1e9-layer schedule without layer_types would allocate gigabytes; head_dim 1e9 would make the expected
// q_proj rows negative).
TEST_F(LoaderReject, ConfigSizesBeyondBounds) {
  rewrite(CheckpointLayout::hf_bf16, [](std::vector<Spec>&) {});
  const json good = read_json_file((out_ / "config.json").string());
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j.contains("text_config") ? j["text_config"] : j);
    std::ofstream(out_ / "config.json") << j.dump();
  };
  const auto t0 = std::chrono::steady_clock::now();
  with([](json& t) {
    t.erase("layer_types");
    t["num_hidden_layers"] = 1000000000;
  });
  expect_load_error({(out_ / "config.json").string(), "num_hidden_layers = 1000000000 is out of range [1, 1024]"});
  with([](json& t) { t["head_dim"] = 1000000000; });
  expect_load_error({(out_ / "config.json").string(), "head_dim = 1000000000 is out of range [1, 4096]"});
  with([](json& t) { t["vocab_size"] = 2147483647; });
  expect_load_error({(out_ / "config.json").string(), "vocab_size = 2147483647 is out of range [1, 16777216]"});
  with([](json& t) { t["num_experts"] = 1 << 20; });
  expect_load_error({"num_experts = 1048576 is out of range [1, 4096]"});
  with([](json& t) { t["moe_intermediate_size"] = 1 << 30; });
  expect_load_error({"moe_intermediate_size = 1073741824 is out of range"});
  with([](json& t) { t["hidden_size"] = 1 << 30; });
  expect_load_error({"hidden_size = 1073741824 is out of range"});
  // Generous sanity limit (not a speed test): the refusals come from the config, before any tensor is read.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  with([](json&) {});
  EXPECT_NO_THROW(load_model(out_.string()));
}

// --check-tensors (docs/api.md §10.1): a NaN or Inf in a tensor the model reads fails the load with the file, the
// tensor, the count and the first element; without the option the same checkpoint loads.
struct Poison {
  std::vector<uint8_t> bytes;  // the tensor's data with the edits (kept alive until rewrite() has written it)
};
void poison(Spec& s, Poison& keep, size_t nbytes, const std::vector<std::pair<int64_t, uint32_t>>& at) {
  keep.bytes.assign(s.src, s.src + nbytes);
  const size_t w = dtype_size(s.dtype);
  for (auto [i, bits] : at) std::memcpy(keep.bytes.data() + i * w, &bits, w);  // little-endian low bytes
  s.src = keep.bytes.data();
}
size_t nbytes_of(const Spec& s) {
  size_t n = dtype_size(s.dtype);
  for (int64_t d : s.shape) n *= static_cast<size_t>(d);
  return n;
}

TEST_F(LoaderReject, CheckTensorsFindsNaN) {
  Poison keep;
  const std::string name = kHf + "2.mlp.shared_expert.down_proj.weight";
  rewrite(CheckpointLayout::hf_bf16, [&](std::vector<Spec>& s) {
    Spec* t = find(s, name);
    poison(*t, keep, nbytes_of(*t), {{37, 0x7fc1}, {300, 0xff80}});  // a NaN, then -Inf
  });
  LoadOptions check;
  check.check_tensors = true;
  expect_load_error({"model.safetensors", "tensor " + name, "2 non-finite values", "first at element 37: NaN"},
                    check);
  EXPECT_NO_THROW(load_model(out_.string()));  // not scanned without the option
}

TEST_F(LoaderReject, CheckTensorsFindsInfInMlxScales) {
  Poison keep;
  const std::string name = kMlx + "1.mlp.switch_mlp.up_proj.scales";
  rewrite(CheckpointLayout::mlx_affine, [&](std::vector<Spec>& s) {
    Spec* t = find(s, name);
    poison(*t, keep, nbytes_of(*t), {{5, 0x7f80}});
  });
  LoadOptions check;
  check.check_tensors = true;
  expect_load_error({"tensor " + name, "1 non-finite value ", "first at element 5: +Inf"}, check);
}

TEST_F(LoaderReject, CheckTensorsPassesCleanAndSkipsUnusedTensors) {
  // the vision / MTP tensors are not read, so a NaN there does not matter; every used tensor is finite
  Poison keep;
  rewrite(CheckpointLayout::hf_bf16, [&](std::vector<Spec>& s) {
    keep.bytes.assign(32, 0xff);  // sixteen NaN
    s.push_back({"mtp.fc.weight", Dtype::BF16, {4, 4}, keep.bytes.data()});
  });
  LoadOptions check;
  check.check_tensors = true;
  EXPECT_NO_THROW(load_model(out_.string(), check));
}

TEST(TensorCheck, FindsEveryKindInEveryFloatDtype) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> f32 = {1.f, -0.f, 3.4e38f, 1e-45f, -inf, 2.f, nan, inf};
  NonFinite r = find_non_finite(Dtype::F32, reinterpret_cast<const uint8_t*>(f32.data()), 8);
  EXPECT_EQ(r.count, 3);
  EXPECT_EQ(r.first, 4);
  EXPECT_FALSE(r.first_nan);
  EXPECT_TRUE(r.first_negative);
  const std::vector<double> f64 = {0.0, 1e308, std::numeric_limits<double>::quiet_NaN()};
  r = find_non_finite(Dtype::F64, reinterpret_cast<const uint8_t*>(f64.data()), 3);
  EXPECT_EQ(r.count, 1);
  EXPECT_EQ(r.first, 2);
  EXPECT_TRUE(r.first_nan);
  // bf16: 0x7f7f is the largest finite value, 0x7f80 +Inf, 0xffc0 a NaN; f16: 0x7bff largest finite, 0x7c00 +Inf
  const std::vector<uint16_t> bf16 = {0x3f80, 0x7f7f, 0xff7f, 0x7f80, 0xffc0};
  r = find_non_finite(Dtype::BF16, reinterpret_cast<const uint8_t*>(bf16.data()), 5);
  EXPECT_EQ(r.count, 2);
  EXPECT_EQ(r.first, 3);
  EXPECT_FALSE(r.first_nan);
  EXPECT_FALSE(r.first_negative);
  const std::vector<uint16_t> f16 = {0x7bff, 0xfbff, 0x7c01, 0x7c00};
  r = find_non_finite(Dtype::F16, reinterpret_cast<const uint8_t*>(f16.data()), 4);
  EXPECT_EQ(r.count, 2);
  EXPECT_EQ(r.first, 2);
  EXPECT_TRUE(r.first_nan);
  const std::vector<uint32_t> u32 = {0xffffffffu, 0x7f800000u};
  EXPECT_EQ(find_non_finite(Dtype::U32, reinterpret_cast<const uint8_t*>(u32.data()), 2).count, 0);
}

}  // namespace
}  // namespace lily
