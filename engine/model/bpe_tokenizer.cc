#include "engine/model/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/synchronization/mutex.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <queue>
#include <utility>

#include "engine/model/files.h"
#include "src/common/strings.h"

namespace tandem::engine {

// ---- ByteLevel mapping ----

namespace bytelevel {
namespace {

struct Tables {
  std::array<std::string, 256> byte_to_char;
  std::array<int, 512> char_to_byte;  // code point -> byte, -1 for none; all mapped code points are < 512
};

const Tables& tables() {
  static const Tables t = [] {
    Tables t;
    t.char_to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int cp = self ? b : next++;
      std::string utf8;
      if (cp < 0x80) {
        utf8.push_back(static_cast<char>(cp));
      } else {
        utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t.byte_to_char[b] = utf8;
      t.char_to_byte[cp] = b;
    }
    return t;
  }();
  return t;
}

}  // namespace

const std::array<std::string, 256>& byteToChar() { return tables().byte_to_char; }

std::string encode(std::string_view bytes) {
  const auto& map = tables().byte_to_char;
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += map[static_cast<unsigned char>(c)];
  return out;
}

bool decode(std::string_view text, std::string* out) {
  const auto& map = tables().char_to_byte;
  out->clear();
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    int cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;  // every mapped character is 1 or 2 bytes of UTF-8
    }
    if (cp >= static_cast<int>(map.size()) || map[cp] < 0) return false;
    out->push_back(static_cast<char>(map[cp]));
  }
  return true;
}

}  // namespace bytelevel

namespace {

using Json = nlohmann::json;

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD
constexpr size_t kMaxCachedWordBytes = 256;                    // as Hugging Face's BPE cache
constexpr size_t kMaxCachedWords = 1 << 17;                    // then the cache starts over

absl::Status bad(const std::string& file, std::string_view json_path, std::string_view what) {
  return absl::InvalidArgumentError(strCat(file, ": ", json_path, ": ", what));
}

std::string typeOf(const Json& j) {
  auto t = j.find("type");
  return t == j.end() ? std::string("(none)") : t->dump();
}

// `text` with each maximal invalid UTF-8 subsequence replaced by U+FFFD, as
// Rust's String::from_utf8_lossy (and so Hugging Face's decode) does.
std::string utf8Lossy(std::string text) {
  auto byteAt = [&](size_t i) { return i < text.size() ? static_cast<unsigned char>(text[i]) : 0; };
  size_t i = 0;
  // Fast path: find the first invalid byte.
  std::string out;
  bool copied = false;
  size_t start = 0;  // start of the valid run not yet copied
  while (i < text.size()) {
    const unsigned char c = byteAt(i);
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    size_t len = 1;  // bytes of the (possibly partial) sequence
    bool ok = need > 0;
    for (size_t k = 1; ok && k <= need; ++k) {
      const unsigned char b = byteAt(i + k);
      const bool in_range = i + k < text.size() && (k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF));
      if (!in_range) {
        ok = false;
        break;
      }
      len = k + 1;
    }
    if (ok) {
      i += need + 1;
      continue;
    }
    if (!copied) {
      out.reserve(text.size() + 8);
      copied = true;
    }
    out.append(text, start, i - start);
    out += kReplacementChar;
    i += len;
    start = i;
  }
  if (!copied) return text;
  out.append(text, start, std::string::npos);
  return out;
}

// The code point that starts at / ends before byte `i` of `s` (U+FFFD, or a
// negative value from ICU, for invalid UTF-8), and its length in bytes.
std::pair<UChar32, int32_t> charAt(std::string_view s, size_t i) {
  int32_t at = static_cast<int32_t>(i);
  UChar32 c;
  U8_NEXT(s.data(), at, static_cast<int32_t>(s.size()), c);
  return {c, at - static_cast<int32_t>(i)};
}
std::pair<UChar32, int32_t> charBefore(std::string_view s, size_t i) {
  int32_t at = static_cast<int32_t>(i);
  UChar32 c;
  U8_PREV(s.data(), 0, at, c);
  return {c, static_cast<int32_t>(i) - at};
}
// Rust's char::is_whitespace (White_Space) and the word characters of
// Hugging Face's single_word check (alphanumeric or '_').
bool isSpace(UChar32 c) { return c >= 0 && u_isUWhiteSpace(c); }
bool isWordChar(UChar32 c) { return c == '_' || (c >= 0 && u_isalnum(c)); }

struct AddedToken {
  std::string content;
  TokenId id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// Finds added tokens in text, leftmost first and longest at a position, as
// Hugging Face's AddedVocabulary does (Aho-Corasick, LeftmostLongest).
class AddedTokenMatcher {
 public:
  void add(const AddedToken* token) {
    if (token->content.empty()) return;
    auto& list = by_first_byte_[static_cast<unsigned char>(token->content[0])];
    list.push_back(token);
    std::stable_sort(list.begin(), list.end(),
                     [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
    empty_ = false;
  }
  bool empty() const { return empty_; }

  // Calls text(piece) for text between tokens and token(t) for each match,
  // in order. lstrip / rstrip drop the whitespace beside a match.
  template <typename TextFn, typename TokenFn>
  void split(std::string_view text, TextFn&& on_text, TokenFn&& on_token) const {
    size_t start = 0;  // first byte not yet handed out
    size_t i = 0;
    while (i < text.size()) {
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : by_first_byte_[static_cast<unsigned char>(text[i])]) {
        if (text.substr(i).starts_with(t->content) && wordBoundaryOk(text, i, t)) {
          hit = t;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t before_end = i;
      if (hit->lstrip)
        while (before_end > start) {
          auto [c, len] = charBefore(text, before_end);
          if (!isSpace(c) || before_end - len < start) break;
          before_end -= len;
        }
      if (before_end > start) on_text(text.substr(start, before_end - start));
      on_token(*hit);
      i += hit->content.size();
      if (hit->rstrip)
        while (i < text.size()) {
          auto [c, len] = charAt(text, i);
          if (!isSpace(c)) break;
          i += len;
        }
      start = i;
    }
    if (start < text.size()) on_text(text.substr(start));
  }

 private:
  static bool wordBoundaryOk(std::string_view text, size_t at, const AddedToken* t) {
    if (!t->single_word) return true;
    const size_t end = at + t->content.size();
    const bool left_ok = at == 0 || !isWordChar(charBefore(text, at).first);
    const bool right_ok = end >= text.size() || !isWordChar(charAt(text, end).first);
    return left_ok && right_ok;
  }

  std::array<std::vector<const AddedToken*>, 256> by_first_byte_;
  bool empty_ = true;
};

// A compiled Split pattern.
struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

// GPT-2's split, what ByteLevel's use_regex applies.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct MergeResult {
  int32_t rank;
  TokenId id;
};

uint64_t pairKey(TokenId a, TokenId b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

struct BpeTokenizer::Impl {
  std::string file;

  // Model.
  absl::flat_hash_map<std::string, TokenId> vocab;  // as written in the file (byte-level characters)
  absl::flat_hash_map<uint64_t, MergeResult> merges;
  std::array<TokenId, 256> byte_id{};      // each byte's single-character token, -1 for none
  std::array<TokenId, 256> fallback_id{};  // <0xXX>, -1 for none (only with byte_fallback)
  bool byte_fallback = false;
  bool ignore_merges = false;
  TokenId unk_id = -1;

  // Added tokens, owned here; the matchers point into it.
  std::vector<std::unique_ptr<AddedToken>> added;
  AddedTokenMatcher raw_matcher;         // normalized: false (or no normalizer)
  AddedTokenMatcher normalized_matcher;  // normalized: true, after the normalizer

  std::vector<const icu::Normalizer2*> normalizers;
  std::vector<std::unique_ptr<Regex>> splits;  // applied in order, each Isolated

  // Decoding: the bytes of each id; -1 entries of `special` decode to "".
  std::vector<std::string> id_bytes;
  std::vector<bool> id_special;
  int vocab_size = 0;
  TokenId bos = -1;
  TokenId eos = -1;

  mutable absl::Mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::vector<TokenId>> cache ABSL_GUARDED_BY(cache_mu);

  std::string normalize(std::string_view text) const;
  void encodeSplit(std::string_view piece, size_t step, std::vector<TokenId>& out, pcre2_match_data* md) const;
  void encodeWord(std::string_view word, std::vector<TokenId>& out) const;
  void bpe(std::string_view word, std::vector<TokenId>& out) const;
};

// ---- loading ----

namespace {

absl::Status parseNormalizer(BpeTokenizer::Impl& impl, const Json& j, const std::string& path) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_object()) return bad(impl.file, path, "expected an object or null");
  const std::string type = typeOf(j);
  if (type == "\"Sequence\"") {
    auto list = j.find("normalizers");
    if (list == j.end() || !list->is_array())
      return bad(impl.file, path + ".normalizers", "missing (expected an array)");
    for (size_t i = 0; i < list->size(); ++i) {
      TANDEM_RETURN_IF_ERROR(parseNormalizer(impl, (*list)[i], strCat(path, ".normalizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  if (type == "\"NFC\"")
    n = icu::Normalizer2::getNFCInstance(status);
  else if (type == "\"NFD\"")
    n = icu::Normalizer2::getNFDInstance(status);
  else if (type == "\"NFKC\"")
    n = icu::Normalizer2::getNFKCInstance(status);
  else if (type == "\"NFKD\"")
    n = icu::Normalizer2::getNFKDInstance(status);
  else
    return bad(impl.file, path + ".type",
               strCat(type, " is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence)"));
  if (U_FAILURE(status) || n == nullptr) return bad(impl.file, path, strCat("ICU: ", u_errorName(status)));
  impl.normalizers.push_back(n);
  return absl::OkStatus();
}

absl::Status addRegex(BpeTokenizer::Impl& impl, const std::string& pattern, const std::string& path) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto regex = std::make_unique<Regex>();
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (regex->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return bad(impl.file, path, strCat("bad regex at offset ", offset, ": ", reinterpret_cast<const char*>(message)));
  }
  regex->jit = pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE) == 0;
  impl.splits.push_back(std::move(regex));
  return absl::OkStatus();
}

std::string regexQuote(std::string_view s) {
  std::string out = "\\Q";
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.substr(i).starts_with("\\E")) {
      out += "\\E\\\\E\\Q";
      ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  return out + "\\E";
}

// Sets `saw_byte_level` when the step is (or ends with) ByteLevel.
absl::Status parsePreTokenizer(BpeTokenizer::Impl& impl, const Json& j, const std::string& path, bool* saw_byte_level) {
  if (!j.is_object()) return bad(impl.file, path, "expected an object");
  if (*saw_byte_level) return bad(impl.file, path, "ByteLevel must be the last pre-tokenizer");
  const std::string type = typeOf(j);
  if (type == "\"Sequence\"") {
    auto list = j.find("pretokenizers");
    if (list == j.end() || !list->is_array())
      return bad(impl.file, path + ".pretokenizers", "missing (expected an array)");
    for (size_t i = 0; i < list->size(); ++i) {
      TANDEM_RETURN_IF_ERROR(
          parsePreTokenizer(impl, (*list)[i], strCat(path, ".pretokenizers[", i, "]"), saw_byte_level));
    }
    return absl::OkStatus();
  }
  if (type == "\"Split\"") {
    const std::string behavior = j.value("behavior", Json()).dump();
    if (behavior != "\"Isolated\"") {
      return bad(impl.file, path + ".behavior", strCat(behavior, " is not supported (supported: Isolated)"));
    }
    if (j.value("invert", false)) return bad(impl.file, path + ".invert", "true is not supported");
    auto pattern = j.find("pattern");
    if (pattern == j.end() || !pattern->is_object()) return bad(impl.file, path + ".pattern", "missing");
    if (auto r = pattern->find("Regex"); r != pattern->end() && r->is_string()) {
      return addRegex(impl, r->get<std::string>(), path + ".pattern.Regex");
    }
    if (auto s = pattern->find("String"); s != pattern->end() && s->is_string()) {
      return addRegex(impl, regexQuote(s->get<std::string>()), path + ".pattern.String");
    }
    return bad(impl.file, path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
  }
  if (type == "\"ByteLevel\"") {
    if (j.value("add_prefix_space", false)) {
      return bad(impl.file, path + ".add_prefix_space", "true is not supported");
    }
    if (j.value("use_regex", true)) TANDEM_RETURN_IF_ERROR(addRegex(impl, std::string(kGpt2Pattern), path));
    *saw_byte_level = true;
    return absl::OkStatus();
  }
  return bad(impl.file, path + ".type", strCat(type, " is not supported (supported: Sequence, Split, ByteLevel)"));
}

absl::Status parseModel(BpeTokenizer::Impl& impl, const Json& model) {
  const std::string& f = impl.file;
  if (!model.is_object()) return bad(f, "model", "missing (expected an object)");
  const std::string type = typeOf(model);
  if (type != "\"BPE\"") return bad(f, "model.type", strCat(type, " is not supported (supported: BPE)"));
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0)) {
    return bad(f, "model.dropout", strCat(d->dump(), " is not supported (only null)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto v = model.find(key);
    if (v != model.end() && !v->is_null() && !(v->is_string() && v->get_ref<const std::string&>().empty())) {
      return bad(f, strCat("model.", key), strCat(v->dump(), " is not supported (only null or \"\")"));
    }
  }
  impl.byte_fallback = model.value("byte_fallback", false);
  impl.ignore_merges = model.value("ignore_merges", false);

  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) return bad(f, "model.vocab", "missing (expected an object)");
  impl.vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= (1 << 30)) {
      return bad(f, strCat("model.vocab[", Json(it.key()).dump(), "]"), "expected a non-negative integer id");
    }
    impl.vocab.emplace(it.key(), static_cast<TokenId>(it->get<int64_t>()));
  }

  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) return bad(f, "model.merges", "missing (expected an array)");
  impl.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return bad(f, strCat("model.merges[", i, "]"), strCat(m.dump(), " is not two tokens separated by a space"));
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return bad(f, strCat("model.merges[", i, "]"), "expected \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = impl.vocab.find(a), ib = impl.vocab.find(b), iab = impl.vocab.find(a + b);
    for (auto [it, tok] : {std::pair{ia, &a}, std::pair{ib, &b}, std::pair{iab, static_cast<std::string*>(nullptr)}}) {
      if (it == impl.vocab.end()) {
        return bad(f, strCat("model.merges[", i, "]"),
                   strCat(Json(tok != nullptr ? *tok : a + b).dump(), " is not in model.vocab"));
      }
    }
    // The first merge of a pair wins, as in Hugging Face.
    impl.merges.try_emplace(pairKey(ia->second, ib->second), MergeResult{static_cast<int32_t>(i), iab->second});
  }

  if (auto u = model.find("unk_token"); u != model.end() && !u->is_null()) {
    if (!u->is_string()) return bad(f, "model.unk_token", "expected a string or null");
    auto it = impl.vocab.find(u->get<std::string>());
    if (it == impl.vocab.end()) return bad(f, "model.unk_token", strCat(u->dump(), " is not in model.vocab"));
    impl.unk_id = it->second;
  }
  const auto& chars = bytelevel::byteToChar();
  for (int b = 0; b < 256; ++b) {
    auto it = impl.vocab.find(chars[b]);
    impl.byte_id[b] = it == impl.vocab.end() ? -1 : it->second;
    char name[8];  // Hugging Face's byte-fallback tokens: <0x0A>
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto fb = impl.vocab.find(absl::string_view(name));
    impl.fallback_id[b] = impl.byte_fallback && fb != impl.vocab.end() ? fb->second : -1;
  }
  return absl::OkStatus();
}

absl::Status parseAddedTokens(BpeTokenizer::Impl& impl, const Json& list) {
  if (list.is_null()) return absl::OkStatus();
  if (!list.is_array()) return bad(impl.file, "added_tokens", "expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& t = list[i];
    const std::string path = strCat("added_tokens[", i, "]");
    if (!t.is_object()) return bad(impl.file, path, "expected an object");
    auto id = t.find("id");
    auto content = t.find("content");
    if (id == t.end() || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() >= (1 << 30)) {
      return bad(impl.file, path + ".id", "missing (expected a non-negative integer)");
    }
    if (content == t.end() || !content->is_string() || content->get_ref<const std::string&>().empty()) {
      return bad(impl.file, path + ".content", "missing (expected a non-empty string)");
    }
    auto token = std::make_unique<AddedToken>();
    token->id = static_cast<TokenId>(id->get<int64_t>());
    token->content = content->get<std::string>();
    token->special = t.value("special", false);
    token->lstrip = t.value("lstrip", false);
    token->rstrip = t.value("rstrip", false);
    token->single_word = t.value("single_word", false);
    token->normalized = t.value("normalized", !token->special);
    impl.added.push_back(std::move(token));
  }
  for (const auto& t : impl.added) {
    (t->normalized && !impl.normalizers.empty() ? impl.normalized_matcher : impl.raw_matcher).add(t.get());
  }
  return absl::OkStatus();
}

absl::Status checkDecoder(const BpeTokenizer::Impl& impl, const Json& j) {
  if (j.is_null()) return bad(impl.file, "decoder", "missing (expected ByteLevel)");
  if (typeOf(j) != "\"ByteLevel\"") {
    return bad(impl.file, "decoder.type", strCat(typeOf(j), " is not supported (supported: ByteLevel)"));
  }
  return absl::OkStatus();
}

absl::Status checkPostProcessor(const BpeTokenizer::Impl& impl, const Json& j, const std::string& path) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = typeOf(j);
  if (type == "\"Sequence\"") {
    auto list = j.find("processors");
    if (list == j.end() || !list->is_array())
      return bad(impl.file, path + ".processors", "missing (expected an array)");
    for (size_t i = 0; i < list->size(); ++i) {
      TANDEM_RETURN_IF_ERROR(checkPostProcessor(impl, (*list)[i], strCat(path, ".processors[", i, "]")));
    }
    return absl::OkStatus();
  }
  for (const char* ok : {"\"ByteLevel\"", "\"TemplateProcessing\"", "\"RobertaProcessing\"", "\"BertProcessing\""}) {
    if (type == ok) return absl::OkStatus();
  }
  return bad(impl.file, path + ".type",
             strCat(type,
                    " is not supported (supported: ByteLevel, TemplateProcessing, RobertaProcessing, "
                    "BertProcessing, Sequence)"));
}

// The first step of `j` (a normalizer, pre-tokenizer or decoder) or of its
// Sequence's steps whose type is one of `types`, as `path.type: "Type"`; ""
// when there is none.
std::string findStep(const Json& j, const std::string& path, std::initializer_list<std::string_view> types) {
  if (!j.is_object()) return "";
  auto type = j.find("type");
  if (type != j.end() && type->is_string() && std::ranges::find(types, type->get_ref<const std::string&>()) != types.end()) {
    return strCat(path, ".type: ", type->dump());
  }
  for (const char* key : {"normalizers", "pretokenizers", "decoders"}) {
    auto list = j.find(key);
    if (list == j.end() || !list->is_array()) continue;
    for (size_t i = 0; i < list->size(); ++i) {
      std::string found = findStep((*list)[i], strCat(path, ".", key, "[", i, "]"), types);
      if (!found.empty()) return found;
    }
  }
  return "";
}

// Where a tokenizer.json shows it was converted from SentencePiece (Llama 2,
// Mistral: normalizer Prepend "▁", pre-tokenizer or decoder Metaspace,
// decoder ByteFallback) and has no ByteLevel step; "" for any other file,
// which is then read, and refused by name, as byte-level BPE.
std::string sentencePieceStep(const Json& j) {
  auto part = [&](const char* key) -> const Json& {
    static const Json kNull;
    auto it = j.find(key);
    return it == j.end() ? kNull : *it;
  };
  if (!findStep(part("pre_tokenizer"), "pre_tokenizer", {"ByteLevel"}).empty() ||
      !findStep(part("decoder"), "decoder", {"ByteLevel"}).empty()) {
    return "";
  }
  for (const char* key : {"normalizer", "pre_tokenizer", "decoder"}) {
    std::string found = findStep(part(key), key, {"Prepend", "Metaspace", "ByteFallback"});
    if (!found.empty()) return found;
  }
  return "";
}

absl::StatusOr<Json> parseJsonFile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, readFile(path));
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(strCat(path, ": malformed JSON: ", e.what()));
  }
}

// tokenizer_config.json's bos_token / eos_token: a string, {"content": ...} or null.
absl::Status specialFromConfig(const BpeTokenizer& tok, const std::string& file, const Json& config, const char* key,
                               TokenId* id) {
  auto v = config.find(key);
  if (v == config.end() || v->is_null()) return absl::OkStatus();
  std::string content;
  if (v->is_string()) {
    content = v->get<std::string>();
  } else if (v->is_object() && v->contains("content") && (*v)["content"].is_string()) {
    content = (*v)["content"].get<std::string>();
  } else {
    return bad(file, key, "expected a string, {\"content\": ...} or null");
  }
  *id = tok.tokenId(content);
  if (*id < 0) return bad(file, key, strCat(Json(content).dump(), " is not a token of the tokenizer.json"));
  return absl::OkStatus();
}

}  // namespace

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::open(const std::string& tokenizer_json,
                                                                 const std::string& tokenizer_config) {
  if (!fileExists(tokenizer_json)) return absl::NotFoundError(strCat(tokenizer_json, ": no such file"));
  TANDEM_ASSIGN_OR_RETURN(Json j, parseJsonFile(tokenizer_json));
  auto impl = std::make_unique<Impl>();
  impl->file = tokenizer_json;
  if (!j.is_object()) return bad(impl->file, "(root)", "expected an object");
  if (std::string step = sentencePieceStep(j); !step.empty()) {
    return absl::FailedPreconditionError(
        strCat(impl->file, ": ", step, ": a SentencePiece-style tokenizer.json (no ByteLevel step); only ",
               "byte-level BPE is read from tokenizer.json"));
  }
  static const Json kNull;
  auto field = [&](const char* key) -> const Json& {
    auto it = j.find(key);
    return it == j.end() ? kNull : *it;
  };

  TANDEM_RETURN_IF_ERROR(parseNormalizer(*impl, field("normalizer"), "normalizer"));
  bool saw_byte_level = false;
  const Json& pre = field("pre_tokenizer");
  if (pre.is_null())
    return bad(impl->file, "pre_tokenizer", "missing (expected ByteLevel, alone or last in a Sequence)");
  TANDEM_RETURN_IF_ERROR(parsePreTokenizer(*impl, pre, "pre_tokenizer", &saw_byte_level));
  if (!saw_byte_level) {
    return bad(impl->file, "pre_tokenizer", "has no ByteLevel step (only byte-level BPE is supported)");
  }
  TANDEM_RETURN_IF_ERROR(parseModel(*impl, field("model")));
  TANDEM_RETURN_IF_ERROR(parseAddedTokens(*impl, field("added_tokens")));
  TANDEM_RETURN_IF_ERROR(checkDecoder(*impl, field("decoder")));
  TANDEM_RETURN_IF_ERROR(checkPostProcessor(*impl, field("post_processor"), "post_processor"));

  // Decoding table.
  int size = 0;
  for (const auto& [text, id] : impl->vocab) size = std::max(size, id + 1);
  for (const auto& t : impl->added) size = std::max(size, t->id + 1);
  impl->vocab_size = size;
  impl->id_bytes.assign(size, std::string());
  impl->id_special.assign(size, false);
  std::string bytes;
  for (const auto& [text, id] : impl->vocab) {
    // As Hugging Face's ByteLevel decoder: a token with a character that
    // stands for no byte decodes to its own UTF-8.
    impl->id_bytes[id] = bytelevel::decode(text, &bytes) ? bytes : text;
  }
  for (int b = 0; b < 256; ++b) {
    if (impl->fallback_id[b] >= 0) impl->id_bytes[impl->fallback_id[b]] = std::string(1, static_cast<char>(b));
  }
  for (const auto& t : impl->added) {
    impl->id_bytes[t->id] = t->special ? std::string() : t->content;
    impl->id_special[t->id] = t->special;
  }

  auto tok = std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
  if (!tokenizer_config.empty()) {
    TANDEM_ASSIGN_OR_RETURN(Json config, parseJsonFile(tokenizer_config));
    if (!config.is_object()) return bad(tokenizer_config, "(root)", "expected an object");
    TANDEM_RETURN_IF_ERROR(specialFromConfig(*tok, tokenizer_config, config, "bos_token", &tok->impl_->bos));
    TANDEM_RETURN_IF_ERROR(specialFromConfig(*tok, tokenizer_config, config, "eos_token", &tok->impl_->eos));
  }
  return tok;
}

int BpeTokenizer::vocabSize() const { return impl_->vocab_size; }
TokenId BpeTokenizer::bosId() const { return impl_->bos; }
TokenId BpeTokenizer::eosId() const { return impl_->eos; }

TokenId BpeTokenizer::tokenId(std::string_view token) const {
  for (const auto& t : impl_->added) {
    if (t->content == token) return t->id;
  }
  auto it = impl_->vocab.find(absl::string_view(token.data(), token.size()));
  return it == impl_->vocab.end() ? -1 : it->second;
}

bool BpeTokenizer::isSpecial(TokenId id) const { return id >= 0 && id < impl_->vocab_size && impl_->id_special[id]; }

// ---- encoding ----

std::string BpeTokenizer::Impl::normalize(std::string_view text) const {
  if (normalizers.empty() || std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) {
    return std::string(text);  // every normalization form leaves ASCII alone
  }
  // ICU works on UTF-16; invalid UTF-8 becomes U+FFFD here (Hugging Face
  // takes only valid UTF-8).
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  for (const icu::Normalizer2* n : normalizers) {
    UErrorCode status = U_ZERO_ERROR;
    if (n->isNormalized(s, status) && U_SUCCESS(status)) continue;
    status = U_ZERO_ERROR;
    icu::UnicodeString out = n->normalize(s, status);
    if (U_SUCCESS(status)) s = std::move(out);
  }
  std::string utf8;
  s.toUTF8String(utf8);
  return utf8;
}

std::vector<TokenId> BpeTokenizer::encode(std::string_view text) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  pcre2_match_data* md = impl_->splits.empty() ? nullptr : pcre2_match_data_create(4, nullptr);
  impl_->raw_matcher.split(
      text,
      [&](std::string_view piece) {
        if (impl_->normalizers.empty()) {
          impl_->encodeSplit(piece, 0, ids, md);
          return;
        }
        const std::string normalized = impl_->normalize(piece);
        impl_->normalized_matcher.split(
            normalized, [&](std::string_view p) { impl_->encodeSplit(p, 0, ids, md); },
            [&](const AddedToken& t) { ids.push_back(t.id); });
      },
      [&](const AddedToken& t) { ids.push_back(t.id); });
  if (md != nullptr) pcre2_match_data_free(md);
  return ids;
}

// Split number `step` in Isolated mode: every match is a piece, and so is
// the text between matches.
void BpeTokenizer::Impl::encodeSplit(std::string_view piece, size_t step, std::vector<TokenId>& out,
                                     pcre2_match_data* md) const {
  if (step == splits.size()) {
    encodeWord(piece, out);
    return;
  }
  const Regex& re = *splits[step];
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t pos = 0, emitted = 0;
  while (pos <= piece.size()) {
    const int rc = re.jit ? pcre2_jit_match(re.code, subject, piece.size(), pos, 0, md, nullptr)
                          : pcre2_match(re.code, subject, piece.size(), pos, 0, md, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH (or a limit): the rest is one piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (start > emitted) encodeSplit(piece.substr(emitted, start - emitted), step + 1, out, md);
    if (end > start) {
      encodeSplit(piece.substr(start, end - start), step + 1, out, md);
      emitted = end;
      pos = end;
    } else {
      emitted = start;
      // Empty match: step over one character.
      pos = start + 1;
      while (pos < piece.size() && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  if (emitted < piece.size()) encodeSplit(piece.substr(emitted), step + 1, out, md);
}

void BpeTokenizer::Impl::encodeWord(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (word.size() == 1 && byte_id[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(byte_id[static_cast<unsigned char>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::MutexLock lock(&cache_mu);
    if (auto it = cache.find(absl::string_view(word.data(), word.size())); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  bpe(word, out);
  if (cacheable) {
    absl::MutexLock lock(&cache_mu);
    if (cache.size() >= kMaxCachedWords) cache.clear();
    cache.try_emplace(std::string(word), out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  }
}

// One word's merges, lowest rank first (leftmost among equals), over a
// linked list of symbols; a heap entry is stale when the pair it was pushed
// for has since changed.
void BpeTokenizer::Impl::bpe(std::string_view word, std::vector<TokenId>& out) const {
  if (ignore_merges) {
    if (auto it = vocab.find(bytelevel::encode(word)); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    TokenId id;
    int prev;
    int next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto addSymbol = [&](TokenId id) {
    const int n = static_cast<int>(symbols.size());
    symbols.push_back({id, n - 1, -1});
    if (n > 0) symbols[n - 1].next = n;
  };
  for (char c : word) {
    const auto b = static_cast<unsigned char>(c);
    if (byte_id[b] >= 0)
      addSymbol(byte_id[b]);
    else if (fallback_id[b] >= 0)
      addSymbol(fallback_id[b]);
    else if (unk_id >= 0)
      addSymbol(unk_id);
    // else: the byte has no token at all; Hugging Face drops it too.
  }
  if (symbols.empty()) return;

  struct Candidate {
    int32_t rank;
    int pos;
    TokenId left_id;  // the pair it was pushed for: stale once either side changed
    TokenId right_id;
    TokenId new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left) {
    if (left < 0) return;
    const int right = symbols[left].next;
    if (right < 0) return;
    auto it = merges.find(pairKey(symbols[left].id, symbols[right].id));
    if (it != merges.end()) heap.push({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.id});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.pos];
    // A symbol's right neighbour changes only by merging into it, which
    // changes its id; so equal ids mean the same pair.
    if (left.id != c.left_id || left.next < 0) continue;  // merged away, merged, or now last
    Symbol& right = symbols[left.next];
    if (right.id != c.right_id) continue;
    left.id = c.new_id;
    const int gone = left.next;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.pos;
    symbols[gone].id = -1;
    consider(left.prev);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

// ---- decoding ----

std::string BpeTokenizer::decode(std::span<const TokenId> tokens) const {
  std::string bytes;
  for (TokenId id : tokens) {
    if (id >= 0 && id < impl_->vocab_size) bytes += impl_->id_bytes[id];
  }
  return utf8Lossy(std::move(bytes));
}

}  // namespace tandem::engine
