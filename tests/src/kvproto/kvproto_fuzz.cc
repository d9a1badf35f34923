// libFuzzer target for the kvproto decoder: any byte string must decode to a
// message or a Status, never crash or read out of bounds (built with
// AddressSanitizer), and whatever decodes must re-encode to the same bytes.
#include <cstdlib>

#include "src/kvproto/kvproto.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::kvproto;
  std::span<const uint8_t> in(data, size);
  auto m = decode(in, {.max_tokens = 4096, .max_blocks = 4096, .num_blocks = 1024, .num_layers = 64});
  if (m.ok()) {
    std::vector<uint8_t> again = encode(*m);
    // Encoding is canonical except for the reserved header word.
    if (again.size() != size || !std::equal(again.begin() + 24, again.end(), data + 24)) std::abort();
  }
  return 0;
}
