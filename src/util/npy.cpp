// .npy v1.0 reader/writer: magic "\x93NUMPY", version bytes, uint16 header length, a Python-dict header
// padded with spaces to a multiple of 64 bytes and ending in '\n', then the raw data.
#include "util/npy.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "util/check.h"

namespace lily {
namespace {

size_t dtype_size(const std::string& descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f8" || descr == "<i8") return 8;
  return 0;
}

// The value of 'key' in the header dict, as the raw text up to the next top-level comma or closing brace.
std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  const std::string k = "'" + key + "'";
  size_t p = header.find(k);
  if (p == std::string::npos) fail("npy file ", path, ": header has no ", k);
  p = header.find(':', p + k.size());
  if (p == std::string::npos) fail("npy file ", path, ": malformed header");
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  size_t e = p;
  if (header[p] == '(') {
    e = header.find(')', p);
    if (e == std::string::npos) fail("npy file ", path, ": malformed shape");
    return header.substr(p, e - p + 1);
  }
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  std::string v = header.substr(p, e - p);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

}  // namespace

int64_t NpyArray::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> NpyArray::as_float() const {
  const int64_t n = size();
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = data.data() + i * dtype_size(descr);
    if (descr == "<f4") { std::memcpy(&out[i], p, 4); }
    else if (descr == "<f8") { double d; std::memcpy(&d, p, 8); out[i] = static_cast<float>(d); }
    else if (descr == "<i4") { int32_t v; std::memcpy(&v, p, 4); out[i] = static_cast<float>(v); }
    else { int64_t v; std::memcpy(&v, p, 8); out[i] = static_cast<float>(v); }
  }
  return out;
}

std::vector<int64_t> NpyArray::as_int64() const {
  LILY_CHECK(descr == "<i4" || descr == "<i8", "npy array of dtype ", descr, " is not integer");
  const int64_t n = size();
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    if (descr == "<i4") { int32_t v; std::memcpy(&v, data.data() + i * 4, 4); out[i] = v; }
    else std::memcpy(&out[i], data.data() + i * 8, 8);
  }
  return out;
}

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::ostringstream dict;
  dict << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict << shape[i] << (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
    n *= shape[i];
  }
  dict << "), }";
  std::string header = dict.str();
  const size_t unpadded = 10 + header.size() + 1;  // magic 6 + version 2 + length 2 + header + '\n'
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  LILY_CHECK(header.size() < 65536, "npy header too long for ", path);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("cannot write ", tmp);
    const uint16_t hl = static_cast<uint16_t>(header.size());
    const char pre[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    f.write(pre, 8);
    const char len[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
    f.write(len, 2);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
    if (!f) fail("write failed: ", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename ", tmp, " to ", path);
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open npy file ", path);
  char pre[10];
  f.read(pre, 10);
  if (!f || std::memcmp(pre, "\x93NUMPY", 6) != 0) fail("npy file ", path, ": bad magic");
  const int major = static_cast<uint8_t>(pre[6]);
  uint32_t hl = static_cast<uint8_t>(pre[8]) | (static_cast<uint32_t>(static_cast<uint8_t>(pre[9])) << 8);
  if (major == 2 || major == 3) {  // 4-byte header length
    char more[2];
    f.read(more, 2);
    hl |= (static_cast<uint32_t>(static_cast<uint8_t>(more[0])) << 16) |
          (static_cast<uint32_t>(static_cast<uint8_t>(more[1])) << 24);
  } else if (major != 1) {
    fail("npy file ", path, ": unsupported version ", major);
  }
  std::string header(hl, '\0');
  f.read(header.data(), hl);
  if (!f) fail("npy file ", path, ": truncated header");
  NpyArray a;
  std::string descr = dict_value(header, "descr", path);
  if (descr.size() < 2) fail("npy file ", path, ": bad descr");
  a.descr = descr.substr(1, descr.size() - 2);
  if (a.descr == "|i1" || dtype_size(a.descr) == 0) fail("npy file ", path, ": unsupported dtype ", a.descr);
  if (dict_value(header, "fortran_order", path) != "False") fail("npy file ", path, ": Fortran order unsupported");
  const std::string shape = dict_value(header, "shape", path);
  std::string inner = shape.substr(1, shape.size() - 2);
  std::istringstream is(inner);
  std::string tok;
  while (std::getline(is, tok, ',')) {
    size_t b = tok.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    try {
      a.shape.push_back(std::stoll(tok.substr(b)));
    } catch (const std::exception&) {
      fail("npy file ", path, ": bad shape ", shape);
    }
    if (a.shape.back() < 0) fail("npy file ", path, ": negative dimension");
  }
  const size_t bytes = static_cast<size_t>(a.size()) * dtype_size(a.descr);
  a.data.resize(bytes);
  f.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(bytes));
  if (static_cast<size_t>(f.gcount()) != bytes) fail("npy file ", path, ": data shorter than shape ", shape);
  return a;
}

}  // namespace lily
