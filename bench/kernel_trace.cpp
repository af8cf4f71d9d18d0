// A kernel timeline for any lily binary, graph replays included: loaded by the CUDA driver through
// CUDA_INJECTION64_PATH=libkernel_trace.so, it records every kernel's GPU start and end (and every memcpy's, as a
// "kernel" named by its direction; with LILY_TRACE_API=1 every CUDA runtime call's host start and end too, as
// "api:<call>" on stream 0, same clock) with CUPTI's activity API and writes them as CSV at exit (LILY_TRACE_OUT,
// default kernel_trace.csv). Event timing cannot see inside a graph, and Nsight Systems is not on the GPU
// machine; tools/trace_summary.py turns the CSV into a per-kernel table of a replayed graph (time on the critical
// path, not just duration, since PDL overlaps launches) and the kernels between replays.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cxxabi.h>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  uint64_t start, end;   // GPU ns
  uint32_t stream, graph_id;
  uint64_t graph_node;
  int grid, block, regs;
  std::string name;      // demangled, template arguments and parameters dropped
};

struct Trace {
  std::mutex mu;
  std::vector<Record> records;
  size_t dropped = 0;
};

Trace& trace() {
  static Trace* t = new Trace;  // never destroyed: the driver may deliver buffers during exit
  return *t;
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, msg ? msg : "?");
}

// "void ns::(anonymous namespace)::kernel<8, true>(float const*, ...)" -> "ns::kernel"
std::string short_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(at, 23);
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  size_t cut = s.find_first_of("<(");
  if (cut != std::string::npos) s.resize(cut);
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8u << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Trace& t = trace();
  CUpti_Activity* rec = nullptr;
  std::vector<Record> got;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {  // as a kernel named by its direction, grid = bytes
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      const char* kind = c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "memcpy_HtoD"
                         : c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "memcpy_DtoH"
                                                                           : "memcpy_other";
      got.push_back({c->start, c->end, c->streamId, c->graphId, c->graphNodeId, static_cast<int>(c->bytes), 0, 0,
                     kind});
      continue;
    }
    if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {  // a host call: grid = its thread (low bits)
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      const char* name = nullptr;
      cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
      std::string n = std::string("api:") + (name ? name : "?");
      if (size_t v = n.find("_v"); v != std::string::npos) n.resize(v);  // cudaMemcpyAsync_v3020 -> cudaMemcpyAsync
      got.push_back({a->start, a->end, 0, 0, 0, static_cast<int>(a->threadId & 0x7fffffff), 0, 0, std::move(n)});
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    got.push_back({k->start, k->end, k->streamId, k->graphId, k->graphNodeId, k->gridX * k->gridY * k->gridZ,
                   k->blockX * k->blockY * k->blockZ, k->registersPerThread, short_name(k->name)});
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(t.mu);
  t.records.insert(t.records.end(), got.begin(), got.end());
  t.dropped += dropped;
}

void write_trace() {
  check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  Trace& t = trace();
  std::lock_guard<std::mutex> lock(t.mu);
  const char* path = std::getenv("LILY_TRACE_OUT");
  if (!path || !*path) path = "kernel_trace.csv";
  FILE* f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path);
    return;
  }
  std::fprintf(f, "start_ns,end_ns,stream,graph_id,graph_node,grid,block,regs,name\n");
  for (const Record& r : t.records)
    std::fprintf(f, "%llu,%llu,%u,%u,%llu,%d,%d,%d,%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.stream, r.graph_id,
                 static_cast<unsigned long long>(r.graph_node), r.grid, r.block, r.regs, r.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "kernel_trace: %zu kernels (%zu records dropped) -> %s\n", t.records.size(), t.dropped,
               path);
}

}  // namespace

// Called by the driver at cuInit when CUDA_INJECTION64_PATH names this library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(memcpy)");
  if (const char* api = std::getenv("LILY_TRACE_API"); api && *api == '1')
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "cuptiActivityEnable(runtime)");
  std::atexit(write_trace);
  return 1;
}
