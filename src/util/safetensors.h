// Safetensors files: a validating reader that trusts nothing (docs/api.md §10.2), memory-mapped tensor views,
// a multi-file store (model.safetensors or shards listed in model.safetensors.index.json) and a streaming
// writer (header first, then tensor data in declaration order; never needs the whole model in memory).
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily {

enum class Dtype { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64 };

size_t dtype_size(Dtype d);             // bytes per element
const char* dtype_name(Dtype d);        // "BF16", ...
bool parse_dtype(std::string_view s, Dtype* out);
std::string shape_str(const std::vector<int64_t>& shape);  // "[8192, 2048]"

// One tensor of a validated header; offsets are relative to the start of the data section.
struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t header_len = 0;                        // N (bytes of JSON after the 8-byte length)
  std::vector<TensorEntry> tensors;               // sorted by offset
  std::map<std::string, std::string> metadata;    // __metadata__
};

// Validates the whole file image `bytes[0, len)` (only the first 8 + N bytes are read; the data section is
// checked by size only). Throws lily::Error naming `file` (and the tensor) on any violation.
SafetensorsHeader parse_safetensors(const uint8_t* bytes, size_t len, const std::string& file);
// Same, from the header JSON text and the data section length (used after reading the header with pread).
SafetensorsHeader parse_safetensors_header(std::string_view json_text, uint64_t data_len, const std::string& file);

// Parses JSON rejecting duplicate keys at any depth; throws lily::Error naming `file`.
nlohmann::json parse_json_strict(std::string_view text, const std::string& file);
// Reads and parses a JSON file with parse_json_strict (size cap 100 MB).
nlohmann::json read_json_file(const std::string& path);

// A view of one tensor's bytes inside a memory map (valid while the owning TensorStore lives).
struct TensorView {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // the safetensors file holding it
  int64_t numel() const;
};

class MappedFile;

// All tensors of a checkpoint directory, memory-mapped read-only.
class TensorStore {
 public:
  // DIR/model.safetensors.index.json (shards) if present, else DIR/model.safetensors.
  static TensorStore open_dir(const std::string& dir);
  // One safetensors file.
  static TensorStore open_file(const std::string& path);

  const TensorView* find(const std::string& name) const;  // nullptr when absent
  const TensorView& get(const std::string& name) const;   // throws naming the tensor
  std::vector<std::string> names() const;                 // sorted
  size_t size() const { return tensors_.size(); }
  uint64_t bytes_on_disk() const { return bytes_on_disk_; }
  // Keeps the memory maps alive independently of this object.
  std::shared_ptr<const void> keepalive() const;

 private:
  void add_file(const std::string& path, const std::vector<std::string>* expected_names);
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
  uint64_t bytes_on_disk_ = 0;
};

// Streaming writer: declare every tensor, then write_header(), then the data of each tensor in declaration
// order (any number of write() calls per tensor), then finish(). Offsets come from the declared sizes.
class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string path);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void add(const std::string& name, Dtype dtype, const std::vector<int64_t>& shape);
  void set_metadata(const std::string& key, const std::string& value);
  void write_header();                       // header padded with spaces to a multiple of 8
  void write(const void* data, size_t n);    // next bytes of the current tensor(s)
  void finish();                             // checks every declared byte was written, closes
  uint64_t data_bytes() const { return total_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
  uint64_t total_ = 0;
  uint64_t written_ = 0;
  bool header_done_ = false;
};

}  // namespace lily
