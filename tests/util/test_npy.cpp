// .npy reader/writer: round trips, the v1.0 header layout numpy expects (64-byte aligned, '\n' terminated),
// other dtypes from hand-built files, and rejection of malformed files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "util/check.h"
#include "util/npy.h"

using namespace lily;

namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("lily_test_npy_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_raw(const std::string& path, const std::string& header_dict, const void* data, size_t bytes,
               int major = 1) {
  std::string h = header_dict;
  const size_t pre = major == 1 ? 10 : 12;
  h.append((64 - (pre + h.size() + 1) % 64) % 64, ' ');
  h.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY", 6);
  f.put(static_cast<char>(major));
  f.put(0);
  const uint32_t n = static_cast<uint32_t>(h.size());
  f.write(reinterpret_cast<const char*>(&n), major == 1 ? 2 : 4);
  f << h;
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

}  // namespace

TEST(Npy, RoundTripTwoDimensional) {
  const std::string p = tmp_path("2d.npy");
  std::vector<float> v(3 * 7);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i) - 3.25f;
  write_npy_f32(p, v.data(), {3, 7});
  const std::string bytes = read_all(p);
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
  EXPECT_EQ(bytes[6], 1);
  const size_t hl = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  EXPECT_EQ((10 + hl) % 64, 0u);
  EXPECT_EQ(bytes[10 + hl - 1], '\n');
  EXPECT_NE(bytes.find("'descr': '<f4'"), std::string::npos);
  EXPECT_NE(bytes.find("'shape': (3, 7)"), std::string::npos);
  EXPECT_EQ(bytes.size(), 10 + hl + v.size() * 4);
  NpyArray a = read_npy(p);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(a.as_float(), v);
  std::filesystem::remove(p);
}

TEST(Npy, OneDimensionalShapeHasTrailingComma) {
  const std::string p = tmp_path("1d.npy");
  const float v[5] = {1, 2, 3, 4, 5};
  write_npy_f32(p, v, {5});
  EXPECT_NE(read_all(p).find("'shape': (5,)"), std::string::npos);
  EXPECT_EQ(read_npy(p).shape, (std::vector<int64_t>{5}));
  std::filesystem::remove(p);
}

TEST(Npy, ReadsOtherDtypesAndVersion2) {
  const std::string p = tmp_path("i8.npy");
  const int64_t ids[4] = {7, -1, 248046, 3};
  write_raw(p, "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), }", ids, sizeof(ids));
  NpyArray a = read_npy(p);
  EXPECT_EQ(a.as_int64(), (std::vector<int64_t>{7, -1, 248046, 3}));
  const double d[3] = {0.5, -2, 1e-3};
  write_raw(p, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", d, sizeof(d), 2);
  a = read_npy(p);
  EXPECT_EQ(a.as_float(), (std::vector<float>{0.5f, -2.0f, 1e-3f}));
  EXPECT_THROW(a.as_int64(), Error);
  std::filesystem::remove(p);
}

TEST(Npy, RejectsMalformedFiles) {
  const std::string p = tmp_path("bad.npy");
  const float v[4] = {1, 2, 3, 4};
  write_raw(p, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", v, sizeof(v));
  EXPECT_THROW(read_npy(p), Error);
  write_raw(p, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }", v, sizeof(v));
  EXPECT_THROW(read_npy(p), Error);
  write_raw(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", v, sizeof(v));
  EXPECT_THROW(read_npy(p), Error);  // data shorter than the shape
  {
    std::ofstream f(p, std::ios::binary);
    f << "NOTNUMPY";
  }
  EXPECT_THROW(read_npy(p), Error);
  EXPECT_THROW(read_npy(tmp_path("missing.npy")), Error);
  std::filesystem::remove(p);
}
