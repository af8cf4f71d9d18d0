// CPU matrix-product throughput: matvec (decode) and matmul_rows over a prompt chunk (prefill) for the real
// model's GDN in_proj_qkv shape [8192, 2048] in bf16, MLX 4-bit and 8-bit. Reports the median of several
// runs as time, weight GB/s and GFLOP/s. Usage: bench_matmul_cpu [threads] [n_tokens]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "model/matmul_cpu.h"
#include "util/bf16.h"

using namespace lily;

namespace {

struct Owned {
  Mat m;
  std::vector<uint16_t> bf, scales, biases;
  std::vector<uint32_t> q;
};

Owned make(MatFormat fmt, int64_t rows, int64_t cols, int bits) {
  std::mt19937_64 rng(1);
  Owned o;
  o.m.format = fmt;
  o.m.rows = rows;
  o.m.cols = cols;
  if (fmt == MatFormat::bf16) {
    o.bf.resize(rows * cols);
    for (auto& v : o.bf) v = f32_to_bf16(static_cast<float>(rng() % 1000) * 1e-3f - 0.5f);
    o.m.data = o.bf.data();
  } else {
    o.m.bits = bits;
    o.m.group_size = 64;
    o.q.resize(rows * cols * bits / 32);
    for (auto& v : o.q) v = static_cast<uint32_t>(rng());
    o.scales.assign(rows * cols / 64, f32_to_bf16(0.01f));
    o.biases.assign(rows * cols / 64, f32_to_bf16(-0.05f));
    o.m.data = o.q.data();
    o.m.scales = o.scales.data();
    o.m.biases = o.biases.data();
  }
  return o;
}

double bytes_of(const Mat& m) {
  if (m.format == MatFormat::bf16) return 2.0 * m.rows * m.cols;
  return m.rows * m.cols * m.bits / 8.0 + 4.0 * m.rows * m.cols / m.group_size;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  const int n_tokens = argc > 2 ? std::atoi(argv[2]) : 128;
  ThreadPool pool(threads);
  const int64_t rows = 8192, cols = 2048;
  std::printf("threads %d, matrix [%lld, %lld]\n", pool.size(), static_cast<long long>(rows),
              static_cast<long long>(cols));
  struct Case { const char* name; MatFormat fmt; int bits; };
  for (Case c : {Case{"bf16", MatFormat::bf16, 0}, Case{"q4", MatFormat::affine, 4}, Case{"q8", MatFormat::affine, 8}}) {
    Owned o = make(c.fmt, rows, cols, c.bits);
    for (int n : {1, n_tokens}) {
      std::vector<float> x(static_cast<size_t>(n) * cols, 0.25f), y(static_cast<size_t>(n) * rows);
      std::vector<double> times;
      for (int rep = 0; rep < 7; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        matmul_rows(o.m, x.data(), n, cols, y.data(), rows, pool);
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(times.begin(), times.end());
      const double t = times[times.size() / 2];
      std::printf("%-5s n=%4d  %8.3f ms  %6.2f GB/s weights  %7.2f GFLOP/s\n", c.name, n, t * 1e3,
                  bytes_of(o.m) / t / 1e9, 2.0 * rows * cols * n / t / 1e9);
    }
  }
  return 0;
}
