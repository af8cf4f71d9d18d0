// NaN / Inf scan of checkpoint tensors (see tensor_check.h).
#include "model/tensor_check.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "util/check.h"
#include "util/log.h"
#include "util/thread_pool.h"

namespace lily {

namespace {

// Elements whose exponent bits are all ones (Inf or NaN) in a format stored as words of type U: exponent mask,
// mantissa mask, sign bit.
template <typename U>
NonFinite scan(const uint8_t* data, int64_t n, U exp_mask, U man_mask, U sign) {
  NonFinite r;
  for (int64_t i = 0; i < n; ++i) {
    U u;
    std::memcpy(&u, data + i * sizeof(U), sizeof(U));
    if ((u & exp_mask) != exp_mask) continue;
    if (r.count++ == 0) {
      r.first = i;
      r.first_nan = (u & man_mask) != 0;
      r.first_negative = (u & sign) != 0;
    }
  }
  return r;
}

std::string kind(const NonFinite& r) { return r.first_nan ? "NaN" : r.first_negative ? "-Inf" : "+Inf"; }

}  // namespace

NonFinite find_non_finite(Dtype dt, const uint8_t* data, int64_t n) {
  switch (dt) {
    case Dtype::BF16: return scan<uint16_t>(data, n, 0x7f80, 0x007f, 0x8000);
    case Dtype::F16: return scan<uint16_t>(data, n, 0x7c00, 0x03ff, 0x8000);
    case Dtype::F32: return scan<uint32_t>(data, n, 0x7f800000u, 0x007fffffu, 0x80000000u);
    case Dtype::F64:
      return scan<uint64_t>(data, n, 0x7ff0000000000000ull, 0x000fffffffffffffull, 0x8000000000000000ull);
    default: return {};
  }
}

void check_finite_tensors(const TensorStore& store, const std::vector<std::string>& names) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  // work items of at most 16 Mi elements, so one large tensor spreads over the pool too
  constexpr int64_t kChunk = int64_t(1) << 24;
  struct Item {
    const TensorView* v;
    int64_t begin, end;
  };
  std::vector<Item> items;
  size_t bytes = 0;
  int n_tensors = 0;
  for (const std::string& name : sorted) {
    const TensorView& v = store.get(name);
    if (v.dtype != Dtype::BF16 && v.dtype != Dtype::F16 && v.dtype != Dtype::F32 && v.dtype != Dtype::F64) continue;
    bytes += v.nbytes;
    ++n_tensors;
    const int64_t n = static_cast<int64_t>(v.nbytes / dtype_size(v.dtype));
    for (int64_t b = 0; b < n; b += kChunk) items.push_back({&v, b, std::min(n, b + kChunk)});
  }
  std::vector<NonFinite> found(items.size());
  ThreadPool::global().parallel_for(0, static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const Item& it = items[i];
      const size_t w = dtype_size(it.v->dtype);
      found[i] = find_non_finite(it.v->dtype, it.v->data + it.begin * w, it.end - it.begin);
      if (found[i].first >= 0) found[i].first += it.begin;
    }
  });
  // items are in name order, chunks in element order: the first hit of the first bad tensor comes first
  for (size_t i = 0; i < items.size(); ++i) {
    if (found[i].count == 0) continue;
    const TensorView* v = items[i].v;
    int64_t count = 0;
    for (size_t j = i; j < items.size() && items[j].v == v; ++j) count += found[j].count;
    fail(v->file, ": tensor ", v->name, ": ", count, count == 1 ? " non-finite value" : " non-finite values",
         " (the first at element ", found[i].first, ": ", kind(found[i]),
         "); the checkpoint is corrupt (--check-tensors)");
  }
  log::info("check-tensors: ", n_tensors, " floating-point tensors (", bytes / 1e9, " GB) finite, ",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
}

}  // namespace lily
