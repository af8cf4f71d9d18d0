// `lily version`: prints the build's version and backends.
#include <cstdio>

#include "cli/command.h"

namespace lily::cli {
namespace {
CommandRegistrar reg({"version", "Print the version and the compiled backends", [](CLI::App&) {
                        return std::function<int()>([] {
#ifdef LILY_HAVE_CUDA
                          std::printf("lily 0.1.0 (backends: cpu, cuda sm_90a)\n");
#else
                          std::printf("lily 0.1.0 (backends: cpu)\n");
#endif
                          return 0;
                        });
                      }});
}  // namespace
}  // namespace lily::cli
