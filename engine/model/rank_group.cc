#include "engine/model/rank_group.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/backend/backend.h"
#include "src/common/strings.h"

namespace tandem::engine {
namespace {

constexpr uint32_t kMagic = 0x47525054;            // "TPRG" in little-endian bytes
constexpr uint64_t kMaxPayload = uint64_t{1} << 34;  // 16 GiB: past any step's partial

struct FrameHeader {
  uint32_t magic;
  uint32_t type;
  uint64_t bytes;
};
static_assert(sizeof(FrameHeader) == 16);

std::string errnoText(int err) { return std::strerror(err); }

// Appends plain values in host order.
class Writer {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

// Reads them back, failing (once, sticky) on a short payload.
class Reader {
 public:
  Reader(std::span<const std::byte> in, const char* what) : in_(in), what_(what) {}
  template <typename T>
  T get(const char* field) {
    T v{};
    if (!status_.ok()) return v;
    if (in_.size() - pos_ < sizeof(T)) {
      status_ = absl::DataLossError(strCat("tensor-parallel ", what_, ": truncated at ", field, " (byte ", pos_, " of ",
                                           in_.size(), ")"));
      return v;
    }
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // A count of `each`-byte items that must fit in what is left.
  uint32_t count(const char* field, size_t each) {
    const uint32_t n = get<uint32_t>(field);
    if (status_.ok() && static_cast<uint64_t>(n) * each > in_.size() - pos_) {
      status_ = absl::DataLossError(
          strCat("tensor-parallel ", what_, ": ", field, " says ", n, " but only ", in_.size() - pos_, " bytes follow"));
    }
    return status_.ok() ? n : 0;
  }
  // The bytes not read yet, and the first failure (OK while there is none).
  std::span<const std::byte> rest() const { return in_.subspan(pos_); }
  const absl::Status& status() const { return status_; }
  absl::Status finish() {
    if (status_.ok() && pos_ != in_.size()) {
      status_ = absl::DataLossError(
          strCat("tensor-parallel ", what_, ": ", in_.size() - pos_, " bytes left over after the last field"));
    }
    return status_;
  }

 private:
  std::span<const std::byte> in_;
  const char* what_;
  size_t pos_ = 0;
  absl::Status status_;
};

absl::Status sendAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(strCat("tensor-parallel link: send failed: ", errnoText(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Reads exactly n bytes. *got says how many arrived before a close or error.
absl::Status recvAll(int fd, void* data, size_t n, size_t* got) {
  auto* p = static_cast<char*>(data);
  *got = 0;
  while (*got < n) {
    const ssize_t r = ::recv(fd, p + *got, n - *got, 0);
    if (r == 0) return absl::UnavailableError("tensor-parallel link: the other end closed it");
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(strCat("tensor-parallel link: receive failed: ", errnoText(errno)));
    }
    *got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

bool knownType(uint32_t t) { return t >= 1 && t <= 8; }

std::string layoutText(const KvLayout& l) {
  return strCat(l.num_layers, " layers x ", l.num_blocks, " blocks of ", l.block_size, " tokens x ", l.num_kv_heads,
                " KV heads x head_dim ", l.head_dim, " of ", kvDtypeName(l.dtype));
}

bool sameLayout(const KvLayout& a, const KvLayout& b) {
  return a.num_layers == b.num_layers && a.num_blocks == b.num_blocks && a.block_size == b.block_size &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim && a.dtype == b.dtype;
}

std::span<const std::byte> floatBytes(const float* p, int64_t n) {
  return {reinterpret_cast<const std::byte*>(p), static_cast<size_t>(n) * sizeof(float)};
}

// A Done frame's status, the error naming the rank.
absl::Status doneStatus(int rank, std::span<const std::byte> payload) {
  if (payload.size() < 4) {
    return absl::DataLossError(strCat("tensor-parallel rank ", rank, " sent a Done of ", payload.size(), " bytes"));
  }
  int32_t code = 0;
  std::memcpy(&code, payload.data(), 4);
  if (code == 0) return absl::OkStatus();
  const std::string_view message(reinterpret_cast<const char*>(payload.data()) + 4, payload.size() - 4);
  const auto c = code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kInternal;
  return absl::Status(c, strCat("tensor-parallel rank ", rank, " failed the step: ", message));
}

}  // namespace

// --- RankLink ---

const char* RankLink::typeName(Type type) {
  switch (type) {
    case Type::kHello: return "Hello";
    case Type::kStep: return "Step";
    case Type::kPartial: return "Partial";
    case Type::kSum: return "Sum";
    case Type::kDone: return "Done";
    case Type::kStageOut: return "StageOut";
    case Type::kKvData: return "KvData";
    case Type::kStageIn: return "StageIn";
  }
  return "?";
}

RankLink::~RankLink() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status RankLink::send(Type type, std::span<const std::byte> payload) {
  const FrameHeader h{kMagic, static_cast<uint32_t>(type), payload.size()};
  TANDEM_RETURN_IF_ERROR(sendAll(fd_, &h, sizeof(h)));
  return sendAll(fd_, payload.data(), payload.size());
}

absl::StatusOr<RankLink::Type> RankLink::receive(std::vector<std::byte>* payload, bool* at_boundary,
                                                 std::optional<std::chrono::milliseconds> timeout) {
  if (timeout && !readable(*timeout)) {
    if (at_boundary != nullptr) *at_boundary = false;
    return absl::DeadlineExceededError(strCat("tensor-parallel link: nothing for ", timeout->count() / 1000, " s"));
  }
  FrameHeader h{};
  size_t got = 0;
  absl::Status s = recvAll(fd_, &h, sizeof(h), &got);
  if (at_boundary != nullptr) *at_boundary = !s.ok() && got == 0;
  if (!s.ok()) return s;
  if (h.magic != kMagic || !knownType(h.type) || h.bytes > kMaxPayload) {
    return absl::DataLossError(strCat("tensor-parallel link: not a frame (magic ", h.magic, ", type ", h.type,
                                      ", ", h.bytes, " bytes)"));
  }
  payload->resize(h.bytes);
  TANDEM_RETURN_IF_ERROR(recvAll(fd_, payload->data(), payload->size(), &got));
  return static_cast<Type>(h.type);
}

bool RankLink::readable(std::chrono::milliseconds timeout) const {
  pollfd pfd{fd_, POLLIN, 0};
  int r;
  do {
    r = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
  } while (r < 0 && errno == EINTR);
  return r > 0;
}

void RankLink::shutdown() { ::shutdown(fd_, SHUT_RDWR); }

// --- messages ---

std::vector<SequenceChunk> RankStep::batch() const {
  std::vector<SequenceChunk> out;
  out.reserve(chunks.size());
  for (const Chunk& c : chunks) {
    out.push_back({.tokens = c.tokens, .start_pos = c.start_pos, .block_table = c.block_table,
                   .want_logits = c.want_logits});
  }
  return out;
}

std::vector<std::byte> encodeRankHello(const RankHello& hello) {
  Writer w;
  w.put(static_cast<uint16_t>(hello.rank));
  w.put(static_cast<uint16_t>(hello.world));
  w.put(static_cast<int32_t>(hello.pid));
  for (int v : {hello.layout.num_layers, hello.layout.num_blocks, hello.layout.block_size, hello.layout.num_kv_heads,
                hello.layout.head_dim}) {
    w.put(static_cast<int32_t>(v));
  }
  w.put(static_cast<uint8_t>(hello.layout.dtype));
  w.put(static_cast<uint8_t>(hello.socket_all_reduce ? 1 : 0));
  return w.take();
}

absl::StatusOr<RankHello> decodeRankHello(std::span<const std::byte> payload) {
  Reader r(payload, "Hello");
  RankHello h;
  h.rank = r.get<uint16_t>("rank");
  h.world = r.get<uint16_t>("world");
  h.pid = r.get<int32_t>("pid");
  h.layout.num_layers = r.get<int32_t>("num_layers");
  h.layout.num_blocks = r.get<int32_t>("num_blocks");
  h.layout.block_size = r.get<int32_t>("block_size");
  h.layout.num_kv_heads = r.get<int32_t>("num_kv_heads");
  h.layout.head_dim = r.get<int32_t>("head_dim");
  const uint8_t dtype = r.get<uint8_t>("kv_dtype");
  h.socket_all_reduce = r.get<uint8_t>("socket_all_reduce") != 0;
  TANDEM_RETURN_IF_ERROR(r.finish());
  if (dtype > static_cast<uint8_t>(KvDtype::kBfloat16)) {
    return absl::DataLossError(strCat("tensor-parallel Hello: unknown KV dtype ", dtype));
  }
  h.layout.dtype = static_cast<KvDtype>(dtype);
  return h;
}

std::vector<std::byte> encodeRankStep(std::span<const std::pair<BlockId, BlockId>> copies,
                                      std::span<const SequenceChunk> batch) {
  Writer w;
  w.put(static_cast<uint32_t>(copies.size()));
  for (const auto& [src, dst] : copies) {
    w.put(src.value());
    w.put(dst.value());
  }
  w.put(static_cast<uint32_t>(batch.size()));
  for (const SequenceChunk& c : batch) {
    w.put(c.start_pos);
    w.put(static_cast<uint8_t>(c.want_logits ? 1 : 0));
    w.put(static_cast<uint32_t>(c.tokens.size()));
    for (TokenId t : c.tokens) w.put(t);
    w.put(static_cast<uint32_t>(c.block_table.size()));
    for (BlockId b : c.block_table) w.put(b.value());
  }
  return w.take();
}

absl::StatusOr<RankStep> decodeRankStep(std::span<const std::byte> payload) {
  Reader r(payload, "Step");
  RankStep step;
  const uint32_t copies = r.count("copies", 8);
  for (uint32_t i = 0; i < copies; ++i) {
    const BlockId src(r.get<int32_t>("copy source"));
    const BlockId dst(r.get<int32_t>("copy destination"));
    step.copies.emplace_back(src, dst);
  }
  const uint32_t chunks = r.count("chunks", 13);  // the smallest chunk: 13 bytes of fields
  for (uint32_t i = 0; i < chunks; ++i) {
    RankStep::Chunk& c = step.chunks.emplace_back();
    c.start_pos = r.get<int32_t>("start_pos");
    c.want_logits = r.get<uint8_t>("want_logits") != 0;
    const uint32_t tokens = r.count("tokens", 4);
    for (uint32_t t = 0; t < tokens; ++t) c.tokens.push_back(r.get<TokenId>("token"));
    const uint32_t blocks = r.count("block_table", 4);
    for (uint32_t b = 0; b < blocks; ++b) c.block_table.emplace_back(r.get<int32_t>("block"));
  }
  TANDEM_RETURN_IF_ERROR(r.finish());
  return step;
}

std::vector<std::byte> encodeRankStage(std::span<const int32_t> layers, std::span<const BlockId> blocks) {
  Writer w;
  w.put(static_cast<uint32_t>(layers.size()));
  for (int32_t l : layers) w.put(l);
  w.put(static_cast<uint32_t>(blocks.size()));
  for (BlockId b : blocks) w.put(b.value());
  return w.take();
}

absl::StatusOr<RankStage> decodeRankStage(std::span<const std::byte> payload, bool with_data) {
  Reader r(payload, with_data ? "StageIn" : "StageOut");
  RankStage stage;
  const uint32_t layers = r.count("layers", 4);
  for (uint32_t i = 0; i < layers; ++i) stage.layers.push_back(r.get<int32_t>("layer"));
  const uint32_t blocks = r.count("blocks", 4);
  for (uint32_t i = 0; i < blocks; ++i) stage.blocks.emplace_back(r.get<int32_t>("block"));
  if (!with_data) TANDEM_RETURN_IF_ERROR(r.finish());  // nothing may follow the lists
  TANDEM_RETURN_IF_ERROR(r.status());
  stage.data = r.rest();
  return stage;
}

// --- leader ---

RankGroupLeader::RankGroupLeader(Options options) : options_(std::move(options)) {
  for (int fd : options_.links) links_.push_back(std::make_unique<RankLink>(fd));
  options_.links.clear();
}

RankGroupLeader::~RankGroupLeader() = default;

absl::StatusOr<std::unique_ptr<RankGroupLeader>> RankGroupLeader::connect(Options options) {
  std::unique_ptr<RankGroupLeader> g(new RankGroupLeader(std::move(options)));
  const int world = g->world();
  const auto deadline = std::chrono::steady_clock::now() + g->options_.hello_timeout;
  std::vector<std::byte> payload;
  for (size_t i = 0; i < g->links_.size(); ++i) {
    const int rank = static_cast<int>(i) + 1;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (!g->links_[i]->readable(std::max(left, std::chrono::milliseconds(0)))) {
      return absl::DeadlineExceededError(strCat("tensor-parallel rank ", rank, " of ", world, " did not say it was ready within ",
                                                g->options_.hello_timeout.count() / 1000, " s"));
    }
    absl::StatusOr<RankLink::Type> type = g->links_[i]->receive(&payload);
    if (!type.ok() && absl::IsUnavailable(type.status())) {
      return absl::UnavailableError(strCat("tensor-parallel rank ", rank, " of ", world,
                                           " closed its link before it was ready (it exited; its log says why): ",
                                           type.status().message()));
    }
    if (!type.ok()) {
      return absl::DataLossError(strCat("tensor-parallel rank ", rank, " of ", world, " broke the protocol before it was ready: ",
                                        type.status().message()));
    }
    if (*type != RankLink::Type::kHello) {
      return absl::DataLossError(strCat("tensor-parallel rank ", rank, " sent ", RankLink::typeName(*type),
                                        " before Hello"));
    }
    TANDEM_ASSIGN_OR_RETURN(const RankHello hello, decodeRankHello(payload));
    if (hello.rank != rank || hello.world != world) {
      return absl::FailedPreconditionError(strCat("tensor-parallel rank ", rank, " of ", world, " says it is rank ",
                                                  hello.rank, " of ", hello.world));
    }
    if (!sameLayout(hello.layout, g->options_.layout)) {
      return absl::FailedPreconditionError(strCat("tensor-parallel rank ", rank, " holds a KV cache of ",
                                                  layoutText(hello.layout), ", rank 0 one of ",
                                                  layoutText(g->options_.layout)));
    }
    if (hello.socket_all_reduce != g->options_.socket_all_reduce) {
      return absl::FailedPreconditionError(strCat(
          "tensor-parallel rank ", rank, " sums its partials ", hello.socket_all_reduce ? "over the link" : "with NCCL",
          ", rank 0 ", g->options_.socket_all_reduce ? "over the link" : "with NCCL", " (they run on other devices)"));
    }
    g->pids_.push_back(hello.pid);
  }
  return g;
}

absl::Status RankGroupLeader::checkLayout(const KvLayout& layout) const {
  if (sameLayout(layout, options_.layout)) return absl::OkStatus();
  return absl::FailedPreconditionError(strCat("rank 0's KV cache is ", layoutText(layout), ", the group's ",
                                              layoutText(options_.layout)));
}

AllReducePartials RankGroupLeader::allReduce() {
  if (!options_.socket_all_reduce) return options_.all_reduce;
  return [this](float* partial, int64_t n) { reduce(partial, n); };
}

void RankGroupLeader::fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
  for (auto& link : links_) link->shutdown();
}

bool RankGroupLeader::expect(size_t follower, RankLink::Type want, std::vector<std::byte>* payload) {
  const int rank = static_cast<int>(follower) + 1;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<RankLink::Type> type = links_[follower]->receive(payload, nullptr, options_.step_timeout);
  wait_time_ += std::chrono::steady_clock::now() - start;
  if (!type.ok()) {
    const std::string why(type.status().message());
    if (absl::IsUnavailable(type.status())) {
      fail(absl::UnavailableError(strCat("tensor-parallel rank ", rank, " of ", world(),
                                         " is gone (its link closed mid-step: it exited or was killed): ", why)));
    } else if (absl::IsDeadlineExceeded(type.status())) {
      fail(absl::DeadlineExceededError(strCat("tensor-parallel rank ", rank, " of ", world(), " sent no ",
                                              RankLink::typeName(want), " within ", options_.step_timeout.count() / 1000,
                                              " s (it is stuck): ", why)));
    } else {
      fail(absl::DataLossError(strCat("tensor-parallel rank ", rank, " of ", world(), " broke the protocol: ", why)));
    }
    return false;
  }
  if (*type == want) return true;
  if (*type == RankLink::Type::kDone) {
    // A rank that failed early answers Done where a Partial was due.
    absl::Status done = doneStatus(rank, *payload);
    fail(done.ok() ? absl::DataLossError(strCat("tensor-parallel rank ", rank, " finished a step rank 0 is still in"))
                   : done);
    return false;
  }
  fail(absl::DataLossError(strCat("tensor-parallel rank ", rank, " sent ", RankLink::typeName(*type), " where ",
                                  RankLink::typeName(want), " was due")));
  return false;
}

void RankGroupLeader::reduce(float* partial, int64_t n) {
  if (!status_.ok() || n <= 0) return;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  // Rank order, left to right: (p0 + p1) + p2 ..., as InProcessAllReduce adds.
  for (size_t i = 0; i < links_.size(); ++i) {
    if (!expect(i, RankLink::Type::kPartial, &scratch_)) return;
    if (scratch_.size() != bytes) {
      fail(absl::DataLossError(strCat("tensor-parallel rank ", i + 1, " sent a partial of ", scratch_.size() / sizeof(float),
                                      " floats, rank 0 has ", n)));
      return;
    }
    const auto* in = reinterpret_cast<const float*>(scratch_.data());
    for (int64_t k = 0; k < n; ++k) partial[k] += in[k];
  }
  for (size_t i = 0; i < links_.size(); ++i) {
    if (absl::Status s = links_[i]->send(RankLink::Type::kSum, floatBytes(partial, n)); !s.ok()) {
      fail(absl::UnavailableError(strCat("tensor-parallel rank ", i + 1, " of ", world(), " is gone: ", s.message())));
      return;
    }
  }
}

absl::Status RankGroupLeader::beginStep(std::span<const std::pair<BlockId, BlockId>> copies,
                                        std::span<const SequenceChunk> batch) {
  TANDEM_RETURN_IF_ERROR(status());
  const std::vector<std::byte> step = encodeRankStep(copies, batch);
  for (size_t i = 0; i < links_.size(); ++i) {
    if (absl::Status s = links_[i]->send(RankLink::Type::kStep, step); !s.ok()) {
      fail(absl::UnavailableError(strCat("tensor-parallel rank ", i + 1, " of ", world(), " is gone: ", s.message())));
      return status_;
    }
  }
  in_step_ = true;
  copies_sent_ += static_cast<int64_t>(copies.size());
  return absl::OkStatus();
}

absl::Status RankGroupLeader::endStep(const absl::Status& rank0) {
  if (!in_step_) return status();
  in_step_ = false;
  if (!rank0.ok()) {
    // The followers may be mid-step, waiting for a Sum that will not come.
    fail(absl::Status(rank0.code(), strCat("tensor-parallel rank 0 failed a step: ", rank0.message())));
    return status_;
  }
  for (size_t i = 0; i < links_.size() && status_.ok(); ++i) {
    if (!expect(i, RankLink::Type::kDone, &scratch_)) break;
    if (absl::Status done = doneStatus(static_cast<int>(i) + 1, scratch_); !done.ok()) fail(std::move(done));
  }
  return status();
}

absl::Status RankGroupLeader::stageOut(std::span<const int32_t> layers, std::span<const BlockId> blocks,
                                       const std::function<void(int, std::span<const std::byte>)>& take) {
  TANDEM_RETURN_IF_ERROR(status());
  if (layers.empty() || blocks.empty()) return absl::OkStatus();
  const std::vector<std::byte> request = encodeRankStage(layers, blocks);
  for (size_t i = 0; i < links_.size(); ++i) {
    if (absl::Status s = links_[i]->send(RankLink::Type::kStageOut, request); !s.ok()) {
      fail(absl::UnavailableError(strCat("tensor-parallel rank ", i + 1, " of ", world(), " is gone: ", s.message())));
      return status_;
    }
  }
  const size_t want = layers.size() * blocks.size() * options_.layout.bytesPerLayerBlock();
  for (size_t i = 0; i < links_.size(); ++i) {
    if (!expect(i, RankLink::Type::kKvData, &scratch_)) return status_;
    if (scratch_.size() != want) {
      fail(absl::DataLossError(strCat("tensor-parallel rank ", i + 1, " sent ", scratch_.size(),
                                      " bytes of KV where ", want, " were due")));
      return status_;
    }
    take(static_cast<int>(i) + 1, scratch_);
  }
  return status();
}

absl::Status RankGroupLeader::stageIn(std::span<const int32_t> layers, std::span<const BlockId> blocks,
                                      const std::function<void(int, std::vector<std::byte>*)>& give) {
  TANDEM_RETURN_IF_ERROR(status());
  if (layers.empty() || blocks.empty()) return absl::OkStatus();
  for (size_t i = 0; i < links_.size(); ++i) {
    std::vector<std::byte> request = encodeRankStage(layers, blocks);
    scratch_.clear();
    give(static_cast<int>(i) + 1, &scratch_);
    request.insert(request.end(), scratch_.begin(), scratch_.end());
    if (absl::Status s = links_[i]->send(RankLink::Type::kStageIn, request); !s.ok()) {
      fail(absl::UnavailableError(strCat("tensor-parallel rank ", i + 1, " of ", world(), " is gone: ", s.message())));
      return status_;
    }
  }
  for (size_t i = 0; i < links_.size() && status_.ok(); ++i) {
    if (!expect(i, RankLink::Type::kDone, &scratch_)) break;
    if (absl::Status done = doneStatus(static_cast<int>(i) + 1, scratch_); !done.ok()) fail(std::move(done));
  }
  return status();
}

absl::Status RankGroupLeader::status() const {
  if (!status_.ok()) return status_;
  if (options_.external_status) return options_.external_status();
  return absl::OkStatus();
}

// --- follower ---

RankGroupFollower::RankGroupFollower(int link, int rank, int world) : link_(link), rank_(rank), world_(world) {}

AllReducePartials RankGroupFollower::allReduce() {
  return [this](float* partial, int64_t n) { reduce(partial, n); };
}

void RankGroupFollower::reduce(float* partial, int64_t n) {
  if (!link_status_.ok() || n <= 0) return;
  if (absl::Status sent = link_.send(RankLink::Type::kPartial, floatBytes(partial, n)); !sent.ok()) {
    link_status_ = absl::UnavailableError(strCat("rank 0 closed the link mid-step: ", sent.message()));
    return;
  }
  absl::StatusOr<RankLink::Type> type = link_.receive(&scratch_);
  if (!type.ok()) {
    link_status_ = absl::UnavailableError(strCat("rank 0 closed the link mid-step: ", type.status().message()));
  } else if (*type != RankLink::Type::kSum || scratch_.size() != static_cast<size_t>(n) * sizeof(float)) {
    link_status_ = absl::DataLossError(strCat("rank 0 sent ", RankLink::typeName(*type), " of ", scratch_.size(),
                                              " bytes where a Sum of ", n, " floats was due"));
  } else {
    std::memcpy(partial, scratch_.data(), scratch_.size());
  }
}

absl::Status RankGroupFollower::hello(const KvLayout& layout, bool socket_all_reduce) {
  const RankHello h{.rank = rank_, .world = world_, .pid = static_cast<int>(::getpid()), .layout = layout,
                    .socket_all_reduce = socket_all_reduce};
  return link_.send(RankLink::Type::kHello, encodeRankHello(h));
}

namespace {

// A Done frame: the status's code and message.
std::vector<std::byte> doneFrame(const absl::Status& result) {
  Writer w;
  w.put(static_cast<int32_t>(result.code()));
  std::vector<std::byte> done = w.take();
  const std::string message(result.message());
  done.insert(done.end(), reinterpret_cast<const std::byte*>(message.data()),
              reinterpret_cast<const std::byte*>(message.data()) + message.size());
  return done;
}

// OK when every layer and block a stage names is in the cache.
absl::Status checkStage(const RankStage& stage, const KvLayout& layout, const char* what) {
  for (int32_t l : stage.layers) {
    if (l < 0 || l >= layout.num_layers) {
      return absl::DataLossError(strCat(what, " names layer ", l, ", outside this rank's ", layout.num_layers));
    }
  }
  for (BlockId b : stage.blocks) {
    if (b.value() < 0 || b.value() >= layout.num_blocks) {
      return absl::DataLossError(strCat(what, " names block ", b.value(), ", outside this rank's ", layout.num_blocks,
                                        " blocks"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RankGroupFollower::runStep(std::span<const std::byte> payload, LlamaModel& model, KvStorage& kv,
                                        Backend& backend, const std::function<absl::Status()>& external_status) {
  TANDEM_ASSIGN_OR_RETURN(RankStep step, decodeRankStep(payload));
  absl::Status result;
  for (const auto& [src, dst] : step.copies) {
    const int n = kv.layout().num_blocks;
    if (src.value() < 0 || src.value() >= n || dst.value() < 0 || dst.value() >= n) {
      result = absl::DataLossError(strCat("Step copies block ", src.value(), " to ", dst.value(), ", outside this rank's ",
                                          n, " blocks"));
      break;
    }
    backend.copyKvBlock(kv, src, dst);
  }
  if (result.ok()) {
    const std::vector<SequenceChunk> batch = step.batch();
    result = model.forward(batch, kv, nullptr);  // rank 0 makes the logits (skipLogits)
  }
  if (result.ok()) result = link_status_;
  if (result.ok()) result = backend.status();
  if (result.ok() && external_status) result = external_status();
  if (!link_status_.ok()) return link_status_;  // no Done: the link is broken
  TANDEM_RETURN_IF_ERROR(link_.send(RankLink::Type::kDone, doneFrame(result)));
  return result;
}

absl::Status RankGroupFollower::runStage(RankLink::Type type, std::span<const std::byte> payload, KvStorage& kv,
                                         Backend& backend) {
  const bool in = type == RankLink::Type::kStageIn;
  const char* what = in ? "StageIn" : "StageOut";
  const size_t block_bytes = kv.layout().bytesPerLayerBlock();
  absl::StatusOr<RankStage> stage = decodeRankStage(payload, in);
  absl::Status result = stage.status();
  if (result.ok()) result = checkStage(*stage, kv.layout(), what);
  const size_t bytes = result.ok() ? stage->layers.size() * stage->blocks.size() * block_bytes : 0;
  if (result.ok() && in && stage->data.size() != bytes) {
    result = absl::DataLossError(strCat("StageIn carries ", stage->data.size(), " bytes for ", bytes));
  }
  if (result.ok()) {
    // Queued copies, one wait (a device pool's are real copies; a host
    // pool's are done at once).
    if (!in) scratch_.resize(bytes);
    size_t at = 0;
    for (int32_t layer : stage->layers) {
      for (BlockId block : stage->blocks) {
        const size_t offset = kv.layerBlockByteOffset(layer, block);
        if (in) {
          backend.uploadKv(kv, offset, stage->data.subspan(at, block_bytes));
        } else {
          backend.downloadKv(kv, offset, std::span<std::byte>(scratch_).subspan(at, block_bytes));
        }
        at += block_bytes;
      }
    }
    backend.finishKvCopies();
    result = backend.status();
  }
  if (in || !result.ok()) {
    TANDEM_RETURN_IF_ERROR(link_.send(RankLink::Type::kDone, doneFrame(result)));
  } else {
    TANDEM_RETURN_IF_ERROR(link_.send(RankLink::Type::kKvData, scratch_));
  }
  return result;
}

absl::Status RankGroupFollower::serve(LlamaModel& model, KvStorage& kv, Backend& backend,
                                      const std::function<absl::Status()>& external_status) {
  std::vector<std::byte> payload;
  model.skipLogits();
  for (;;) {
    bool at_boundary = false;
    absl::StatusOr<RankLink::Type> type = link_.receive(&payload, &at_boundary);
    if (!type.ok()) {
      if (at_boundary && absl::IsUnavailable(type.status())) return absl::OkStatus();  // rank 0 is done
      return type.status();
    }
    switch (*type) {
      case RankLink::Type::kStep:
        TANDEM_RETURN_IF_ERROR(runStep(payload, model, kv, backend, external_status));
        break;
      case RankLink::Type::kStageOut:
      case RankLink::Type::kStageIn:
        TANDEM_RETURN_IF_ERROR(runStage(*type, payload, kv, backend));
        break;
      default:
        return absl::DataLossError(
            strCat("rank 0 sent ", RankLink::typeName(*type), " where a Step, StageOut or StageIn was due"));
    }
  }
}

}  // namespace tandem::engine
