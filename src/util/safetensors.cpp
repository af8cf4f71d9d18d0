// Safetensors reader (validating, mmap-backed), multi-file store and streaming writer. See safetensors.h.
#include "util/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "util/check.h"
#include "util/utf8.h"

namespace lily {

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {Dtype::BOOL, "BOOL", 1}, {Dtype::U8, "U8", 1},     {Dtype::I8, "I8", 1},     {Dtype::U16, "U16", 2},
    {Dtype::I16, "I16", 2},   {Dtype::F16, "F16", 2},   {Dtype::BF16, "BF16", 2}, {Dtype::U32, "U32", 4},
    {Dtype::I32, "I32", 4},   {Dtype::F32, "F32", 4},   {Dtype::U64, "U64", 8},   {Dtype::I64, "I64", 8},
    {Dtype::F64, "F64", 8},
};

struct DuplicateKey {
  std::string key;
};

bool non_negative_int(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) { *out = v.get<uint64_t>(); return true; }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) { *out = static_cast<uint64_t>(v.get<int64_t>()); return true; }
  return false;
}

}  // namespace

size_t dtype_size(Dtype d) {
  for (const auto& i : kDtypes) if (i.dtype == d) return i.size;
  return 0;
}

const char* dtype_name(Dtype d) {
  for (const auto& i : kDtypes) if (i.dtype == d) return i.name;
  return "?";
}

bool parse_dtype(std::string_view s, Dtype* out) {
  for (const auto& i : kDtypes) {
    if (s == i.name) { *out = i.dtype; return true; }
  }
  return false;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

nlohmann::json parse_json_strict(std::string_view text, const std::string& file) {
  if (!utf8_valid(text)) fail(file, ": JSON is not valid UTF-8");
  std::vector<std::set<std::string>> keys;  // one set per open object
  auto cb = [&keys](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) {
      keys.emplace_back();
    } else if (ev == E::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (ev == E::key && !keys.empty()) {
      auto k = parsed.get<std::string>();
      if (!keys.back().insert(k).second) throw DuplicateKey{k};
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), cb, true);
  } catch (const DuplicateKey& d) {
    fail(file, ": duplicate JSON key \"", d.key, "\"");
  } catch (const nlohmann::json::exception& e) {
    fail(file, ": invalid JSON: ", e.what());
  }
}

nlohmann::json read_json_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, ": cannot open: ", std::strerror(errno));
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    text.append(buf, n);
    if (text.size() > kMaxHeader) {
      std::fclose(f);
      fail(path, ": file larger than ", kMaxHeader, " bytes");
    }
  }
  bool err = std::ferror(f);
  std::fclose(f);
  if (err) fail(path, ": read error");
  return parse_json_strict(text, path);
}

SafetensorsHeader parse_safetensors_header(std::string_view text, uint64_t data_len, const std::string& file) {
  SafetensorsHeader h;
  h.header_len = text.size();
  if (text.empty() || text[0] != '{') fail(file, ": safetensors header does not start with '{'");
  nlohmann::json j = parse_json_strict(text, file + " (safetensors header)");
  if (!j.is_object()) fail(file, ": safetensors header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(file, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail(file, ": __metadata__ value of \"", m.key(), "\" is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) fail(file, ": tensor ", name, ": entry is not an object");
    for (auto f = v.begin(); f != v.end(); ++f) {
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        fail(file, ": tensor ", name, ": unknown field \"", f.key(), "\"");
    }
    TensorEntry t;
    t.name = name;
    auto d = v.find("dtype");
    if (d == v.end() || !d->is_string()) fail(file, ": tensor ", name, ": missing or non-string dtype");
    if (!parse_dtype(d->get<std::string>(), &t.dtype))
      fail(file, ": tensor ", name, ": unknown dtype \"", d->get<std::string>(), "\"");
    auto s = v.find("shape");
    if (s == v.end() || !s->is_array()) fail(file, ": tensor ", name, ": missing or non-array shape");
    uint64_t numel = 1;
    for (const auto& dim : *s) {
      uint64_t x;
      if (!non_negative_int(dim, &x) || x > static_cast<uint64_t>(INT64_MAX))
        fail(file, ": tensor ", name, ": shape entry ", dim.dump(), " is not a non-negative integer");
      t.shape.push_back(static_cast<int64_t>(x));
      if (__builtin_mul_overflow(numel, x, &numel)) fail(file, ": tensor ", name, ": element count overflows");
    }
    auto o = v.find("data_offsets");
    if (o == v.end() || !o->is_array() || o->size() != 2)
      fail(file, ": tensor ", name, ": data_offsets must be an array [begin, end]");
    if (!non_negative_int((*o)[0], &t.begin) || !non_negative_int((*o)[1], &t.end))
      fail(file, ": tensor ", name, ": data_offsets are not non-negative integers");
    if (t.begin > t.end) fail(file, ": tensor ", name, ": data_offsets begin ", t.begin, " > end ", t.end);
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &bytes))
      fail(file, ": tensor ", name, ": byte size overflows");
    if (t.end - t.begin != bytes)
      fail(file, ": tensor ", name, ": data_offsets span ", t.end - t.begin, " bytes but ", dtype_name(t.dtype), " ",
           shape_str(t.shape), " needs ", bytes);
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  for (const auto& t : h.tensors) {
    if (t.begin < expect) fail(file, ": tensor ", t.name, ": data overlaps the previous tensor (begins at ", t.begin,
                               ", previous ends at ", expect, ")");
    if (t.begin > expect) fail(file, ": tensor ", t.name, ": gap before its data (begins at ", t.begin,
                               ", previous ends at ", expect, ")");
    expect = t.end;
  }
  if (expect != data_len)
    fail(file, ": data section is ", data_len, " bytes but the tensors cover ", expect,
         expect < data_len ? " (trailing bytes)" : " (file truncated)");
  return h;
}

SafetensorsHeader parse_safetensors(const uint8_t* bytes, size_t len, const std::string& file) {
  if (len < 8) fail(file, ": file is ", len, " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > kMaxHeader) fail(file, ": header length ", n, " exceeds the cap of ", kMaxHeader);
  if (n > len - 8) fail(file, ": header length ", n, " runs past the end of the file (", len, " bytes)");
  std::string_view text(reinterpret_cast<const char*>(bytes + 8), n);
  return parse_safetensors_header(text, len - 8 - n, file);
}

// ---------------------------------------------------------------- memory-mapped file

class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path, ": cannot open: ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd_, &st) != 0) fail(path, ": cannot stat: ", std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(path, ": not a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ < 8) fail(path, ": file is ", size_, " bytes, shorter than the 8-byte header length");
    uint8_t len8[8];
    read_exact(len8, 8, 0);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];
    if (n > kMaxHeader) fail(path, ": header length ", n, " exceeds the cap of ", kMaxHeader);
    if (n > size_ - 8) fail(path, ": header length ", n, " runs past the end of the file (", size_, " bytes)");
    std::string text(n, '\0');
    read_exact(text.data(), n, 8);
    header_ = parse_safetensors_header(text, size_ - 8 - n, path);
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) fail(path, ": mmap failed: ", std::strerror(errno));
    base_ = static_cast<const uint8_t*>(p);
#ifdef MADV_DONTDUMP
    ::madvise(p, size_, MADV_DONTDUMP);  // keep tens of GB of weights out of core dumps
#endif
  }
  ~MappedFile() {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const uint8_t* data_start() const { return base_ + 8 + header_.header_len; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void read_exact(void* dst, size_t n, uint64_t off) {
    auto* d = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(fd_, d, n, static_cast<off_t>(off));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) fail(path_, ": read error at offset ", off);
      d += r;
      n -= static_cast<size_t>(r);
      off += static_cast<uint64_t>(r);
    }
  }
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  const uint8_t* base_ = nullptr;
  SafetensorsHeader header_;
};

// ---------------------------------------------------------------- store

void TensorStore::add_file(const std::string& path, const std::vector<std::string>* expected_names) {
  auto mf = std::make_shared<MappedFile>(path);
  std::set<std::string> expected;
  if (expected_names) expected.insert(expected_names->begin(), expected_names->end());
  for (const auto& t : mf->header().tensors) {
    if (expected_names && !expected.count(t.name))
      fail(path, ": tensor ", t.name, " is not assigned to this shard by model.safetensors.index.json");
    expected.erase(t.name);
    if (tensors_.count(t.name))
      fail(path, ": tensor ", t.name, " also appears in ", tensors_[t.name].file);
    TensorView v;
    v.name = t.name;
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.data = mf->data_start() + t.begin;
    v.nbytes = t.end - t.begin;
    v.file = path;
    tensors_.emplace(t.name, std::move(v));
  }
  if (expected_names && !expected.empty())
    fail("model.safetensors.index.json lists tensor ", *expected.begin(), " in ", path, " but the shard lacks it");
  bytes_on_disk_ += mf->size();
  files_.push_back(std::move(mf));
}

TensorStore TensorStore::open_file(const std::string& path) {
  TensorStore s;
  s.add_file(path, nullptr);
  return s;
}

TensorStore TensorStore::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  TensorStore s;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    nlohmann::json j = read_json_file(index.string());
    if (!j.is_object()) fail(index.string(), ": not a JSON object");
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) fail(index.string(), ": missing or non-object \"weight_map\"");
    std::map<std::string, std::vector<std::string>> by_shard;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) fail(index.string(), ": weight_map entry ", it.key(), " is not a string");
      std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
          shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos)
        fail(index.string(), ": weight_map entry ", it.key(), " names an invalid shard file \"", shard, "\"");
      by_shard[shard].push_back(it.key());
    }
    if (by_shard.empty()) fail(index.string(), ": weight_map is empty");
    for (const auto& [shard, names] : by_shard) {
      fs::path p = fs::path(dir) / shard;
      if (!fs::exists(p)) fail(index.string(), ": shard ", shard, " (holding ", names.front(), ") does not exist");
      s.add_file(p.string(), &names);
    }
  } else if (fs::exists(single)) {
    s.add_file(single.string(), nullptr);
  } else {
    fail(dir, ": neither model.safetensors nor model.safetensors.index.json exists");
  }
  return s;
}

const TensorView* TensorStore::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& TensorStore::get(const std::string& name) const {
  const TensorView* v = find(name);
  if (!v) fail("tensor ", name, " is missing from the checkpoint");
  return *v;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [n, v] : tensors_) out.push_back(n);
  return out;
}

std::shared_ptr<const void> TensorStore::keepalive() const {
  return std::make_shared<std::vector<std::shared_ptr<MappedFile>>>(files_);
}

// ---------------------------------------------------------------- writer

SafetensorsWriter::SafetensorsWriter(std::string path) : path_(std::move(path)) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (f_) std::fclose(f_);
}

void SafetensorsWriter::add(const std::string& name, Dtype dtype, const std::vector<int64_t>& shape) {
  LILY_CHECK(!header_done_, path_, ": tensor ", name, " declared after the header was written");
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    LILY_CHECK(d >= 0, path_, ": tensor ", name, " has a negative dimension");
    n *= static_cast<uint64_t>(d);
  }
  TensorEntry e{name, dtype, shape, total_, total_ + n};
  total_ += n;
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

void SafetensorsWriter::write_header() {
  LILY_CHECK(!header_done_, path_, ": header written twice");
  nlohmann::json j = nlohmann::json::object();
  if (!metadata_.empty()) j["__metadata__"] = metadata_;
  for (const auto& e : entries_) {
    LILY_CHECK(!j.contains(e.name), path_, ": tensor ", e.name, " declared twice");
    j[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = j.dump();
  while (text.size() % 8) text.push_back(' ');
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) fail(path_, ": cannot create: ", std::strerror(errno));
  std::setvbuf(f_, nullptr, _IOFBF, 1 << 22);
  uint8_t len8[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len8[i] = static_cast<uint8_t>(n >> (8 * i));
  if (std::fwrite(len8, 1, 8, f_) != 8 || std::fwrite(text.data(), 1, n, f_) != n)
    fail(path_, ": write failed: ", std::strerror(errno));
  header_done_ = true;
}

void SafetensorsWriter::write(const void* data, size_t n) {
  LILY_CHECK(header_done_, path_, ": data written before the header");
  LILY_CHECK(written_ + n <= total_, path_, ": more data written than declared");
  if (n && std::fwrite(data, 1, n, f_) != n) fail(path_, ": write failed: ", std::strerror(errno));
  written_ += n;
}

void SafetensorsWriter::finish() {
  if (!header_done_) write_header();
  LILY_CHECK(written_ == total_, path_, ": ", written_, " of ", total_, " declared data bytes written");
  if (std::fclose(f_) != 0) {
    f_ = nullptr;
    fail(path_, ": close failed: ", std::strerror(errno));
  }
  f_ = nullptr;
}

}  // namespace lily
