// A per-request constraint on the next token (structured output): before each sample the generation loop asks
// the filter which ids may come next, and afterwards tells it the id that was chosen. The filter is driven on
// the engine thread only, one call pair per generated token, in order.
#pragma once
#include <cstdint>
#include <span>

namespace lily {

class TokenFilter {
 public:
  virtual ~TokenFilter() = default;
  // Writes the ids allowed at the next position as a bitmask: bit (id % 32) of mask[id / 32], mask.size() =
  // ceil(vocab / 32). Returns false when every id is allowed here (the mask is then not read), e.g. while the
  // reasoning block is still open. An all-zero mask is never returned (the filter then allows its end ids).
  virtual bool allowed(std::span<uint32_t> mask) = 0;
  // The id sampled at that position (one allowed by the last mask).
  virtual void accept(int32_t token) = 0;
};

}  // namespace lily
