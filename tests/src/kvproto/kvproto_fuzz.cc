// libFuzzer target for the kvproto decoder and the authentication
// handshake: any byte string must decode to a message or a Status, never
// crash or read out of bounds (built with AddressSanitizer), and whatever
// decodes must re-encode to the same bytes (a newer peer's Hello to the same
// bytes less its appended fields). What decodes as a handshake message is
// then fed to the acceptor (AuthHello, AuthProof) or a connector
// (AuthChallenge), which must answer with a challenge, a proof or a typed
// failure, and never authenticate a proof it did not derive itself.
#include <algorithm>
#include <cstdlib>

#include "src/auth/kv_handshake.h"
#include "src/kvproto/kvproto.h"

namespace {

using namespace tandem;

const std::shared_ptr<const auth::PoolKeys>& fuzzKeys() {
  static const auto keys = *auth::PoolKeys::of({std::string(64, 'f')}, {"fuzz"});
  return keys;
}

void handshake(const kvproto::Message& m) {
  if (auto* h = std::get_if<kvproto::AuthHello>(&m.body)) {
    auth::KvAuthAcceptor a(fuzzKeys(), {kvproto::PeerRole::kPrefill, "p"});
    auto r = a.onHello(*h);
    if (std::holds_alternative<kvproto::AuthChallenge>(r)) {
      // A proof the fuzzer made up cannot match the fresh nonce's MAC.
      if (!a.onProof(kvproto::AuthProof{std::string(kvproto::kAuthMacSize, 'x')}).has_value()) std::abort();
      if (a.authenticated()) std::abort();
    }
  } else if (auto* p = std::get_if<kvproto::AuthProof>(&m.body)) {
    auth::KvAuthAcceptor a(fuzzKeys(), {kvproto::PeerRole::kPrefill, "p"});
    if (!a.onProof(*p).has_value() || a.authenticated()) std::abort();  // no challenge was issued
  } else if (auto* c = std::get_if<kvproto::AuthChallenge>(&m.body)) {
    auto connector = auth::KvAuthConnector::start(fuzzKeys(), {kvproto::PeerRole::kDecode, "d"});
    if (!connector.ok()) std::abort();
    // The connector's nonce is fresh: no made-up challenge can carry its MAC.
    if (!std::holds_alternative<auth::AuthFailure>(connector->onChallenge(*c))) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::kvproto;
  std::span<const uint8_t> in(data, size);
  auto m = decode(in, {.max_tokens = 4096, .max_blocks = 4096, .num_blocks = 1024, .num_layers = 64});
  if (m.ok()) {
    std::vector<uint8_t> again = encode(*m);
    // Encoding is canonical except for the header (version, reserved word),
    // the fields a newer version appended to its Hello (dropped), and those
    // an older Hello lacks (added with their defaults, at the end).
    const uint16_t version = static_cast<uint16_t>(data[4] | (data[5] << 8));
    const bool appended = version > kMaxVersion;
    const bool older_hello = std::holds_alternative<Hello>(m->body) && version < kFirstTensorParallelVersion;
    if (older_hello) {
      if (again.size() != size + 6) std::abort();  // u16 tp_rank, tp_world, kv_head_begin
      if (!std::equal(data + 24, data + size, again.begin() + 24)) std::abort();
    } else {
      if (appended ? again.size() > size : again.size() != size) std::abort();
      if (!std::equal(again.begin() + 24, again.end(), data + 24)) std::abort();
    }
    handshake(*m);
  }
  return 0;
}
