// Safetensors reader/writer: a writer round trip, then one corrupted file per validation rule of
// docs/api.md §10.2, each asserting its own message, and the sharded-index rules.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "util/check.h"
#include "util/safetensors.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(LILY_BINARY_DIR) / "test_tmp" / "safetensors" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  // 8-byte little-endian length + header text + `data_len` bytes of a seeded pattern.
  std::string raw(const std::string& name, const std::string& header, size_t data_len, uint64_t claimed_len = ~0ull) {
    std::string path = (dir_ / name).string();
    std::ofstream f(path, std::ios::binary);
    uint64_t n = claimed_len == ~0ull ? header.size() : claimed_len;
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
    f << header;
    std::mt19937 rng(7);
    for (size_t i = 0; i < data_len; ++i) f.put(static_cast<char>(rng()));
    return path;
  }
  void expect_reject(const std::string& path, const std::string& needle) {
    try {
      TensorStore::open_file(path);
      ADD_FAILURE() << "accepted; expected an error containing: " << needle;
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(needle), std::string::npos) << "message: " << m << "\nexpected: " << needle;
      EXPECT_NE(m.find(fs::path(path).filename().string()), std::string::npos) << "no file name in: " << m;
    }
  }
  void expect_dir_reject(const std::string& needle) {
    try {
      TensorStore::open_dir(dir_.string());
      ADD_FAILURE() << "accepted; expected an error containing: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what()
                                                                       << "\nexpected: " << needle;
    }
  }
  std::string two(const std::string& a_off, const std::string& b_off) {
    return R"({"a":{"dtype":"F32","shape":[2],"data_offsets":)" + a_off +
           R"(},"b":{"dtype":"BF16","shape":[3],"data_offsets":)" + b_off + "}}";
  }
  // A valid shard file holding `names` as F32 [3] each.
  void shard(const std::string& file, const std::vector<std::string>& names) {
    SafetensorsWriter w((dir_ / file).string());
    for (const auto& n : names) w.add(n, Dtype::F32, {3});
    w.write_header();
    float v[3] = {1.5f, -2.0f, 0.25f};
    for (size_t i = 0; i < names.size(); ++i) w.write(v, sizeof v);
    w.finish();
  }
  void index(const std::string& json) { std::ofstream(dir_ / "model.safetensors.index.json") << json; }
  fs::path dir_;
};

TEST_F(Safetensors, WriterRoundTrip) {
  std::string path = (dir_ / "x.safetensors").string();
  SafetensorsWriter w(path);
  w.add("m", Dtype::BF16, {3, 5});
  w.add("scalar", Dtype::F32, {});
  w.add("empty", Dtype::U32, {0, 4});
  w.add("ids", Dtype::I64, {2});
  w.set_metadata("format", "pt");
  w.write_header();
  std::vector<uint16_t> m(15);
  for (int i = 0; i < 15; ++i) m[i] = static_cast<uint16_t>(0x3f80 + i);
  w.write(m.data(), 10);  // a tensor may arrive in several pieces
  w.write(m.data() + 5, 20);
  float s = 3.25f;
  w.write(&s, 4);
  int64_t ids[2] = {-7, 1ll << 40};
  w.write(ids, 16);
  w.finish();
  TensorStore st = TensorStore::open_file(path);
  ASSERT_EQ(st.size(), 4u);
  const TensorView& v = st.get("m");
  EXPECT_EQ(v.dtype, Dtype::BF16);
  EXPECT_EQ(v.shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(std::memcmp(v.data, m.data(), 30), 0);
  EXPECT_EQ(st.get("scalar").numel(), 1);
  EXPECT_EQ(*reinterpret_cast<const float*>(st.get("scalar").data), 3.25f);
  EXPECT_EQ(st.get("empty").nbytes, 0u);
  EXPECT_EQ(reinterpret_cast<const int64_t*>(st.get("ids").data)[1], 1ll << 40);
  EXPECT_EQ(st.find("nope"), nullptr);
  EXPECT_EQ(st.bytes_on_disk(), fs::file_size(path));
  // The data section starts 8-byte aligned (header padded with spaces); "m" is the first tensor.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(st.get("m").data) % 8, 0u);
}

TEST_F(Safetensors, AcceptsPaddingAndZeroSizedTensors) {
  auto p = raw("ok.safetensors", R"({"z":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                                 R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   )", 8);
  EXPECT_EQ(TensorStore::open_file(p).size(), 2u);
}

TEST_F(Safetensors, RejectsTruncatedFile) {
  expect_reject(raw("t.safetensors", two("[0,8]", "[8,14]"), 13), "file truncated");
}

TEST_F(Safetensors, RejectsTrailingBytes) {
  expect_reject(raw("t.safetensors", two("[0,8]", "[8,14]"), 15), "trailing bytes");
}

TEST_F(Safetensors, RejectsOverlappingOffsets) {
  expect_reject(raw("o.safetensors", two("[0,8]", "[6,12]"), 12), "tensor b: data overlaps the previous tensor");
}

TEST_F(Safetensors, RejectsGap) {
  expect_reject(raw("g.safetensors", two("[0,8]", "[10,16]"), 16), "tensor b: gap before its data");
}

TEST_F(Safetensors, RejectsSizeMismatch) {
  expect_reject(raw("s.safetensors", two("[0,8]", "[8,16]"), 16), "tensor b: data_offsets span 8 bytes but BF16 [3] needs 6");
}

TEST_F(Safetensors, RejectsUnknownDtype) {
  expect_reject(raw("d.safetensors", R"({"a":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})", 2),
                "tensor a: unknown dtype \"F8_E9\"");
}

TEST_F(Safetensors, RejectsNegativeShape) {
  expect_reject(raw("n.safetensors", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                "tensor a: shape entry -2 is not a non-negative integer");
}

TEST_F(Safetensors, RejectsElementCountOverflow) {
  expect_reject(raw("v.safetensors",
                    R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8),
                "tensor a: element count overflows");
}

TEST_F(Safetensors, RejectsBeginAfterEnd) {
  expect_reject(raw("b.safetensors", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 4),
                "data_offsets begin 4 > end 2");
}

TEST_F(Safetensors, RejectsHeaderOverCap) {
  expect_reject(raw("c.safetensors", "{}", 0, 100'000'001), "header length 100000001 exceeds the cap of 100000000");
}

TEST_F(Safetensors, RejectsHeaderPastEnd) {
  expect_reject(raw("e.safetensors", "{}", 0, 5000), "header length 5000 runs past the end of the file");
}

TEST_F(Safetensors, RejectsShortFile) {
  std::string p = (dir_ / "short.safetensors").string();
  std::ofstream(p) << "abc";
  expect_reject(p, "shorter than the 8-byte header length");
}

TEST_F(Safetensors, RejectsHeaderNotJson) {
  expect_reject(raw("j.safetensors", R"({"a": {"dtype": "F32", "shape": [1], )", 0), "invalid JSON");
}

TEST_F(Safetensors, RejectsHeaderNotObject) {
  expect_reject(raw("k.safetensors", "[1, 2]", 0), "does not start with '{'");
}

TEST_F(Safetensors, RejectsDuplicateKey) {
  expect_reject(raw("dup.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                "duplicate JSON key \"a\"");
  expect_reject(raw("dup2.safetensors", R"({"a":{"dtype":"F32","dtype":"U32","shape":[1],"data_offsets":[0,4]}})", 4),
                "duplicate JSON key \"dtype\"");
}

TEST_F(Safetensors, RejectsBadMetadata) {
  expect_reject(raw("m.safetensors", R"({"__metadata__":{"format":3}})", 0), "__metadata__ value of \"format\" is not a string");
}

TEST_F(Safetensors, RejectsInvalidUtf8) {
  expect_reject(raw("u.safetensors", "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0),
                "not valid UTF-8");
  expect_reject(raw("u2.safetensors", "{\"a\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0),
                "not valid UTF-8");  // overlong '/'
}

TEST_F(Safetensors, RejectsUnknownField) {
  expect_reject(raw("f.safetensors", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"extra":1}})", 0),
                "tensor a: unknown field \"extra\"");
}

TEST_F(Safetensors, ShardedIndexLoads) {
  shard("s1.safetensors", {"x", "y"});
  shard("s2.safetensors", {"z"});
  index(R"({"metadata":{"total_size":36},"weight_map":{"x":"s1.safetensors","y":"s1.safetensors","z":"s2.safetensors"}})");
  TensorStore st = TensorStore::open_dir(dir_.string());
  EXPECT_EQ(st.names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(reinterpret_cast<const float*>(st.get("z").data)[1], -2.0f);
  EXPECT_NE(st.get("z").file.find("s2.safetensors"), std::string::npos);
}

TEST_F(Safetensors, RejectsIndexToMissingShard) {
  shard("s1.safetensors", {"x"});
  index(R"({"weight_map":{"x":"s1.safetensors","y":"s9.safetensors"}})");
  expect_dir_reject("shard s9.safetensors (holding y) does not exist");
}

TEST_F(Safetensors, RejectsTensorListedButAbsent) {
  shard("s1.safetensors", {"x"});
  index(R"({"weight_map":{"x":"s1.safetensors","w":"s1.safetensors"}})");
  expect_dir_reject("lists tensor w in");
}

TEST_F(Safetensors, RejectsTensorListedTwice) {
  shard("s1.safetensors", {"x"});
  shard("s2.safetensors", {"x"});
  index(R"({"weight_map":{"x":"s1.safetensors","x":"s2.safetensors"}})");
  expect_dir_reject("duplicate JSON key \"x\"");
}

TEST_F(Safetensors, RejectsUnlistedTensorInShard) {
  shard("s1.safetensors", {"x", "q"});
  index(R"({"weight_map":{"x":"s1.safetensors"}})");
  expect_dir_reject("tensor q is not assigned to this shard");
}

TEST_F(Safetensors, RejectsShardPathEscape) {
  index(R"({"weight_map":{"x":"../s1.safetensors"}})");
  expect_dir_reject("invalid shard file");
}

TEST_F(Safetensors, RejectsEmptyDirectory) { expect_dir_reject("neither model.safetensors nor"); }

TEST_F(Safetensors, FuzzedHeadersNeverCrash) {
  // Seeded byte mutations of a valid header: every outcome is accept or lily::Error, never a crash.
  std::string base = two("[0,8]", "[8,14]");
  std::mt19937 rng(123);
  int rejected = 0;
  for (int it = 0; it < 400; ++it) {
    std::string h = base;
    int flips = 1 + rng() % 3;
    for (int k = 0; k < flips; ++k) h[rng() % h.size()] = static_cast<char>(rng());
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(static_cast<uint64_t>(h.size()) >> (8 * i));
    bytes += h + std::string(14, 'x');
    try {
      parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "fuzz");
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 300);
}

}  // namespace
}  // namespace lily
