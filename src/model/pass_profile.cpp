#include "model/pass_profile.h"

namespace lily {

FamilyTime& FamilyTable::row(const std::string& name) {
  for (FamilyTime& r : rows_)
    if (r.name == name) return r;
  rows_.push_back({name, 0, 0, 0});
  return rows_.back();
}

void FamilyTable::add(const std::string& name, double ms, double flops) {
  FamilyTime& r = row(name);
  r.ms += ms;
  r.flops += flops;
}

void FamilyTable::count(const std::string& name, double flops) {
  FamilyTime& r = row(name);
  r.flops += flops;
  ++r.marks;
}

void WallClockProfiler::mark(const char* family, double flops) {
  const Clock::time_point now = Clock::now();
  if (!open_.empty()) table_.add(open_, std::chrono::duration<double, std::milli>(now - since_).count(), 0);
  table_.count(family, flops);
  open_ = family;
  since_ = now;
}

std::vector<FamilyTime> WallClockProfiler::finish() {
  if (!open_.empty()) table_.add(open_, std::chrono::duration<double, std::milli>(Clock::now() - since_).count(), 0);
  std::vector<FamilyTime> out = table_.rows();
  table_.clear();
  open_.clear();
  return out;
}

}  // namespace lily
