// Phase stamps of one decode step's persistent launches (MoE, GDN mixer) and attention split / combine launches,
// for benchmarks (KernelOptions::trace): thread 0 of every block stamps %globaltimer at its phase boundaries into
// its launch's slot. The owner (the bench's step recorder) allocates the device buffer before the step is
// captured; each recording of the step hands the slots out again from 0, in launch order, so a slot keeps its
// kernel and grid. Launchers take a StepTrace* that is null when tracing is off.
#pragma once
#include <cstddef>

namespace lily::cuda {

inline constexpr int kTraceBlocks = 160;  // blocks stamped per launch (blocks beyond are not)
inline constexpr int kTraceStamps = 16;   // stamps per block; stamp 15 = griddepcontrol.wait returned
inline constexpr int kTraceSlots = 96;    // launches per step

enum TraceKernel : int { kTraceMoe = 0, kTraceGdn = 1, kTraceAttnSplit = 2, kTraceAttnCombine = 3 };

struct StepTrace {
  unsigned long long* stamps = nullptr;  // device [kTraceSlots][kTraceBlocks][kTraceStamps]
  int used = 0;                          // slots handed out in the current recording
  int kind[kTraceSlots] = {};            // TraceKernel of each slot handed out

  void begin() { used = 0; }             // a new recording of the step
  // The next slot for a launch of `kernel` (block b's stamp i at [b * kTraceStamps + i]); null when every slot
  // is taken or the GPU has more SMs than kTraceBlocks.
  unsigned long long* take(int kernel);
};

StepTrace step_trace_alloc();            // zeroed device buffer
void step_trace_free(StepTrace& t);
// The last step's stamps, summarised per kernel kind (benchmarks; prints to stdout).
void print_step_trace(const StepTrace& t);

}  // namespace lily::cuda
