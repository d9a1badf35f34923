// libFuzzer target for the kvproto decoder: any byte string must decode to a
// message or a Status, never crash or read out of bounds (built with
// AddressSanitizer), and whatever decodes must re-encode to the same bytes
// (a newer peer's Hello to the same bytes less its appended fields).
#include <algorithm>
#include <cstdlib>

#include "src/kvproto/kvproto.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::kvproto;
  std::span<const uint8_t> in(data, size);
  auto m = decode(in, {.max_tokens = 4096, .max_blocks = 4096, .num_blocks = 1024, .num_layers = 64});
  if (m.ok()) {
    std::vector<uint8_t> again = encode(*m);
    // Encoding is canonical except for the header (version, reserved word)
    // and the fields a newer version appended to its Hello (dropped).
    const uint16_t version = static_cast<uint16_t>(data[4] | (data[5] << 8));
    const bool appended = version > kMaxVersion;
    if (appended ? again.size() > size : again.size() != size) std::abort();
    if (!std::equal(again.begin() + 24, again.end(), data + 24)) std::abort();
  }
  return 0;
}
