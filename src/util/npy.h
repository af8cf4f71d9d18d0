// NumPy .npy files (format version 1.0, little-endian, C order): a writer for float32 arrays and a reader
// for float32 / float64 / int32 / int64 arrays (used by `lily score` and the golden tests).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lily {

struct NpyArray {
  std::vector<int64_t> shape;   // e.g. [T, vocab]
  std::string descr;            // "<f4", "<f8", "<i4" or "<i8"
  std::vector<uint8_t> data;    // raw little-endian elements, C order

  int64_t size() const;                 // product of shape
  std::vector<float> as_float() const;  // converts any supported dtype
  std::vector<int64_t> as_int64() const;  // integer dtypes only
};

// Writes float32 `data` [prod(shape)] as FILE; writes to FILE.tmp then renames. Throws lily::Error.
void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

// Reads FILE; throws lily::Error naming the file on malformed headers, Fortran order, unsupported dtypes
// or a size mismatch.
NpyArray read_npy(const std::string& path);

}  // namespace lily
