#include "engine/model/model_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numbers>

#include <nlohmann/json.hpp>

#include "engine/backend/kernel_math.h"
#include "src/common/strings.h"

namespace tandem::engine {
namespace {

using Json = nlohmann::json;

// Architectures whose checkpoints have exactly the tensors and math this
// engine implements (RMSNorm, RoPE, GQA attention, SwiGLU), and what each
// adds (model_config.h). The first one is the default.
constexpr ArchSpec kArchSpecs[] = {
    {.architecture = "LlamaForCausalLM", .model_type = "llama", .sliding_window_caps_context = true},
    {.architecture = "MistralForCausalLM", .model_type = "mistral", .sliding_window_caps_context = true},
    {.architecture = "Qwen2ForCausalLM",
     .model_type = "qwen2",
     .qkv_bias = true,
     .has_use_sliding_window = true,
     .reads_attention_bias = false},
    {.architecture = "Qwen3ForCausalLM",
     .model_type = "qwen3",
     .qk_norm = true,
     .has_use_sliding_window = true,
     .head_dim_required = true},
};
constexpr std::string_view kSupportedDtypes[] = {"float32", "bfloat16", "float16"};

std::string describe(const Json& j) {
  if (j.is_number_float()) return strCat("floating-point number ", j.dump());
  if (j.is_number_integer()) return strCat("integer ", j.dump());
  if (j.is_string()) return strCat("string ", j.dump());
  return j.type_name();
}

// Reads fields out of the top-level object; the first problem wins (a config
// is fixed by hand one field at a time, and later checks may depend on
// earlier fields).
class FieldReader {
 public:
  // `prefix` names a nested object in messages ("rope_scaling.").
  FieldReader(const Json& root, std::string_view source, std::string_view prefix = "")
      : root_(root), source_(source), prefix_(prefix) {}

  std::string_view source() const { return source_; }

  absl::Status error(std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(strCat(source_, ": ", prefix_, field, ": ", what));
  }

  // Absent and null both mean "use the default": HF writes null for unset ids.
  const Json* get(std::string_view field) const {
    auto it = root_.find(std::string(field));
    if (it == root_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<int> intValue(std::string_view field, const Json& j) const {
    if (!j.is_number_integer()) return error(field, strCat("expected integer, got ", describe(j)));
    if (j.is_number_unsigned()) {
      auto v = j.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int>::max())) return error(field, "out of range");
      return static_cast<int>(v);
    }
    auto v = j.get<int64_t>();
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      return error(field, "out of range");
    }
    return static_cast<int>(v);
  }

  // Present and a positive integer, or an error.
  absl::Status requiredPositive(std::string_view field, int* out) const {
    const Json* j = get(field);
    if (j == nullptr) return error(field, "required field is missing");
    return positiveValue(field, *j, out);
  }

  // Leaves *out alone when absent.
  absl::Status optionalPositive(std::string_view field, int* out) const {
    const Json* j = get(field);
    if (j == nullptr) return absl::OkStatus();
    return positiveValue(field, *j, out);
  }

  absl::Status optionalPositiveFloat(std::string_view field, float* out) const {
    const Json* j = get(field);
    if (j == nullptr) return absl::OkStatus();
    if (!j->is_number()) return error(field, strCat("expected number, got ", describe(*j)));
    double v = j->get<double>();
    if (!(v > 0) || v > std::numeric_limits<float>::max()) {
      return error(field, strCat("must be a positive number, got ", j->dump()));
    }
    *out = static_cast<float>(v);
    return absl::OkStatus();
  }

  absl::Status optionalBool(std::string_view field, bool* out) const {
    const Json* j = get(field);
    if (j == nullptr) return absl::OkStatus();
    if (!j->is_boolean()) return error(field, strCat("expected boolean, got ", describe(*j)));
    *out = j->get<bool>();
    return absl::OkStatus();
  }

  // A token id >= 0 (null or absent: keep the default).
  absl::Status optionalTokenId(std::string_view field, TokenId* out) const {
    const Json* j = get(field);
    if (j == nullptr) return absl::OkStatus();
    return tokenIdValue(field, *j, out);
  }

  // eos_token_id: one id, or (Llama 3.1+, Qwen) a non-empty list of them.
  absl::Status optionalTokenIds(std::string_view field, std::vector<TokenId>* out) const {
    const Json* j = get(field);
    if (j == nullptr) return absl::OkStatus();
    if (!j->is_array()) {
      out->assign(1, 0);
      return tokenIdValue(field, *j, &out->front());
    }
    if (j->empty()) return error(field, "expected an integer or a non-empty list of integers, got []");
    out->assign(j->size(), 0);
    for (size_t i = 0; i < j->size(); ++i) TANDEM_RETURN_IF_ERROR(tokenIdValue(field, (*j)[i], &(*out)[i]));
    return absl::OkStatus();
  }

 private:
  absl::Status tokenIdValue(std::string_view field, const Json& j, TokenId* out) const {
    TANDEM_ASSIGN_OR_RETURN(int id, intValue(field, j));
    if (id < 0) return error(field, strCat("must be >= 0, got ", id));
    *out = id;
    return absl::OkStatus();
  }

  absl::Status positiveValue(std::string_view field, const Json& j, int* out) const {
    TANDEM_ASSIGN_OR_RETURN(int v, intValue(field, j));
    if (v <= 0) return error(field, strCat("must be positive, got ", v));
    *out = v;
    return absl::OkStatus();
  }

  const Json& root_;
  std::string_view source_;
  std::string_view prefix_;
};

absl::Status readArchitecture(const FieldReader& r, ModelConfig* c) {
  const Json* arch = r.get("architectures");
  // Hand-written configs sometimes omit it; the default is Llama.
  if (arch == nullptr) return absl::OkStatus();
  if (!arch->is_array()) return r.error("architectures", strCat("expected list of strings, got ", describe(*arch)));
  std::string seen;
  for (const Json& a : *arch) {
    if (!a.is_string()) return r.error("architectures", strCat("expected list of strings, got ", describe(a)));
    const auto& name = a.get_ref<const std::string&>();
    if (findArchSpec(name) != nullptr) {
      c->architecture = name;
      return absl::OkStatus();
    }
    seen += seen.empty() ? name : strCat(", ", name);
  }
  return r.error("architectures",
                 strCat("unsupported architecture [", seen, "]; this engine runs ", supportedArchitectures()));
}

// rope_scaling: null/absent or {"rope_type" (or the older "type"): "default"}
// is plain RoPE; "llama3" needs all four of its fields; any other type is
// refused by name.
absl::Status readRopeScaling(const FieldReader& r, RopeScaling* out) {
  const Json* j = r.get("rope_scaling");
  if (j == nullptr) return absl::OkStatus();
  if (!j->is_object()) return r.error("rope_scaling", strCat("expected an object or null, got ", describe(*j)));
  std::string type_key = "rope_type";
  auto type = j->find(type_key);
  if (type == j->end() || type->is_null()) {
    type_key = "type";
    type = j->find(type_key);
  }
  if (type == j->end() || type->is_null()) {
    return r.error("rope_scaling", strCat("missing rope_type (supported: llama3), got ", j->dump()));
  }
  const std::string field = strCat("rope_scaling.", type_key);
  if (!type->is_string()) return r.error(field, strCat("expected string, got ", describe(*type)));
  const auto& name = type->get_ref<const std::string&>();
  if (name == "default") return absl::OkStatus();
  if (name != "llama3") return r.error(field, strCat("\"", name, "\" is not supported (supported: llama3)"));

  FieldReader sub(*j, r.source(), "rope_scaling.");
  auto number = [&](std::string_view key, float* v) -> absl::Status {
    if (sub.get(key) == nullptr) return sub.error(key, "required for rope_type \"llama3\"");
    return sub.optionalPositiveFloat(key, v);
  };
  RopeScaling s;
  s.type = RopeScaling::Type::kLlama3;
  TANDEM_RETURN_IF_ERROR(number("factor", &s.factor));
  TANDEM_RETURN_IF_ERROR(number("low_freq_factor", &s.low_freq_factor));
  TANDEM_RETURN_IF_ERROR(number("high_freq_factor", &s.high_freq_factor));
  if (sub.get("original_max_position_embeddings") == nullptr) {
    return sub.error("original_max_position_embeddings", "required for rope_type \"llama3\"");
  }
  TANDEM_RETURN_IF_ERROR(sub.requiredPositive("original_max_position_embeddings", &s.original_max_position_embeddings));
  // The smoothing band divides by their difference.
  if (!(s.high_freq_factor > s.low_freq_factor)) {
    return sub.error("high_freq_factor", strCat("must be greater than low_freq_factor (", s.low_freq_factor, "), got ",
                                                s.high_freq_factor));
  }
  *out = s;
  return absl::OkStatus();
}

// Sliding-window attention is not implemented. Mistral's window caps the
// context (below, in parseModelConfig); Qwen2/3 switch it on with
// use_sliding_window (and newer Qwen3 configs per layer with layer_types).
absl::Status rejectSlidingWindow(const FieldReader& r, const ArchSpec& arch) {
  if (!arch.has_use_sliding_window) return absl::OkStatus();
  bool on = false;
  TANDEM_RETURN_IF_ERROR(r.optionalBool("use_sliding_window", &on));
  if (on) {
    return r.error("use_sliding_window",
                   "sliding-window attention is not supported (set it to false to run with full attention)");
  }
  if (const Json* types = r.get("layer_types"); types != nullptr) {
    if (!types->is_array()) return r.error("layer_types", strCat("expected list of strings, got ", describe(*types)));
    for (const Json& t : *types) {
      if (t != "full_attention") {
        return r.error("layer_types", strCat("only \"full_attention\" layers are supported, got ", t.dump()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status readDtype(const FieldReader& r, ModelConfig* c) {
  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  std::string_view field = "torch_dtype";
  const Json* j = r.get(field);
  if (j == nullptr) {
    field = "dtype";
    j = r.get(field);
  }
  if (j == nullptr) return absl::OkStatus();
  if (!j->is_string()) return r.error(field, strCat("expected string, got ", describe(*j)));
  const auto& dtype = j->get_ref<const std::string&>();
  for (std::string_view ok : kSupportedDtypes) {
    if (dtype == ok) {
      c->torch_dtype = dtype;
      return absl::OkStatus();
    }
  }
  return r.error(field, strCat("unsupported dtype \"", dtype, "\" (supported: float32, bfloat16, float16)"));
}

// Features of the Llama config family that change the math. Silently
// ignoring them would produce a model that runs but says the wrong things.
absl::Status rejectUnsupportedFeatures(const FieldReader& r, const ArchSpec& arch) {
  for (std::string_view flag : {"attention_bias", "mlp_bias"}) {
    if (flag == "attention_bias" && !arch.reads_attention_bias) continue;
    bool on = false;
    TANDEM_RETURN_IF_ERROR(r.optionalBool(flag, &on));
    if (on) return r.error(flag, strCat("biases in projections are not supported for ", arch.architecture));
  }
  if (const Json* act = r.get("hidden_act"); act != nullptr && *act != "silu") {
    return r.error("hidden_act", strCat("only \"silu\" (SwiGLU) is supported, got ", act->dump()));
  }
  return absl::OkStatus();
}

absl::Status validateShape(const FieldReader& r, ModelConfig* c) {
  if (c->num_heads % c->num_kv_heads != 0) {
    return r.error("num_key_value_heads",
                   strCat("must divide num_attention_heads (", c->num_heads, "), got ", c->num_kv_heads));
  }
  if (r.get("head_dim") == nullptr) {
    // Qwen3Config's default head_dim (128) is not hidden_size / heads; real
    // Qwen3 configs always say it, and guessing would be wrong either way.
    if (c->arch().head_dim_required) return r.error("head_dim", strCat("required for ", c->architecture));
    if (c->hidden_size % c->num_heads != 0) {
      return r.error("num_attention_heads", strCat("must divide hidden_size (", c->hidden_size,
                                                   ") when head_dim is absent, got ", c->num_heads));
    }
    c->head_dim = c->hidden_size / c->num_heads;
  }
  // RoPE rotates pairs of dimensions.
  if (c->head_dim % 2 != 0) return r.error("head_dim", strCat("must be even for rotary embeddings, got ", c->head_dim));
  if (static_cast<int64_t>(c->head_dim) * c->num_heads > std::numeric_limits<int>::max()) {
    return r.error("head_dim", "head_dim * num_attention_heads is out of range");
  }
  return absl::OkStatus();
}

// Shortest decimal that reads back as the same float, as a double: without
// this, 1e-5f would be written as 9.99999974737875e-06.
double floatForJson(float v) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf) - 1, v);
  *res.ptr = '\0';
  return std::strtod(buf, nullptr);
}

}  // namespace

const ArchSpec* findArchSpec(std::string_view architecture) {
  for (const ArchSpec& spec : kArchSpecs) {
    if (spec.architecture == architecture) return &spec;
  }
  return nullptr;
}

std::string supportedArchitectures() {
  std::string out;
  for (const ArchSpec& spec : kArchSpecs)
    out += out.empty() ? std::string(spec.architecture) : strCat(", ", spec.architecture);
  return out;
}

const ArchSpec& ModelConfig::arch() const {
  const ArchSpec* spec = findArchSpec(architecture);
  return spec != nullptr ? *spec : kArchSpecs[0];
}

bool ModelConfig::isEos(TokenId t) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), t) != eos_token_ids.end();
}

std::vector<float> ropeInverseFrequencies(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv_freq[static_cast<size_t>(i)] = kmath::ropeInvFreq(i, c.head_dim, c.rope_theta);
  if (c.rope_scaling.type != RopeScaling::Type::kLlama3) return inv_freq;
  // HF _compute_llama3_parameters, operation for operation in fp32 (its
  // Python scalars meet fp32 tensors, so they are rounded to fp32 first).
  const RopeScaling& s = c.rope_scaling;
  const auto old_context = static_cast<float>(s.original_max_position_embeddings);
  const auto low_freq_wavelen = static_cast<float>(static_cast<double>(s.original_max_position_embeddings) /
                                                   static_cast<double>(s.low_freq_factor));
  const auto high_freq_wavelen = static_cast<float>(static_cast<double>(s.original_max_position_embeddings) /
                                                    static_cast<double>(s.high_freq_factor));
  const auto band =
      static_cast<float>(static_cast<double>(s.high_freq_factor) - static_cast<double>(s.low_freq_factor));
  const auto two_pi = static_cast<float>(2.0 * std::numbers::pi);
  for (float& f : inv_freq) {
    const float wavelen = two_pi / f;
    if (wavelen > low_freq_wavelen) {
      f = f / s.factor;  // low frequencies: stretched by factor
    } else if (!(wavelen < high_freq_wavelen)) {
      // The band between: interpolated.
      const float smooth = (old_context / wavelen - s.low_freq_factor) / band;
      const float a = (1.0f - smooth) * f / s.factor;
      const float b = smooth * f;
      f = a + b;
    }
  }
  return inv_freq;
}

absl::StatusOr<ModelConfig> parseModelConfig(std::string_view json_text, std::string_view source) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(strCat(source, ": invalid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        strCat(source, ": expected a JSON object at the top level, got ", describe(root)));
  }

  FieldReader r(root, source);
  ModelConfig c;
  TANDEM_RETURN_IF_ERROR(readArchitecture(r, &c));
  TANDEM_RETURN_IF_ERROR(r.requiredPositive("vocab_size", &c.vocab_size));
  TANDEM_RETURN_IF_ERROR(r.requiredPositive("hidden_size", &c.hidden_size));
  TANDEM_RETURN_IF_ERROR(r.requiredPositive("intermediate_size", &c.intermediate_size));
  TANDEM_RETURN_IF_ERROR(r.requiredPositive("num_hidden_layers", &c.num_layers));
  TANDEM_RETURN_IF_ERROR(r.requiredPositive("num_attention_heads", &c.num_heads));
  c.num_kv_heads = c.num_heads;
  TANDEM_RETURN_IF_ERROR(r.optionalPositive("num_key_value_heads", &c.num_kv_heads));
  TANDEM_RETURN_IF_ERROR(r.optionalPositive("head_dim", &c.head_dim));
  TANDEM_RETURN_IF_ERROR(r.optionalPositiveFloat("rms_norm_eps", &c.rms_norm_eps));
  TANDEM_RETURN_IF_ERROR(r.optionalPositiveFloat("rope_theta", &c.rope_theta));
  c.max_position_embeddings = kDefaultMaxPositionEmbeddings;
  TANDEM_RETURN_IF_ERROR(r.optionalPositive("max_position_embeddings", &c.max_position_embeddings));
  TANDEM_RETURN_IF_ERROR(r.optionalBool("tie_word_embeddings", &c.tie_word_embeddings));
  TANDEM_RETURN_IF_ERROR(r.optionalTokenId("bos_token_id", &c.bos_token_id));
  TANDEM_RETURN_IF_ERROR(r.optionalTokenIds("eos_token_id", &c.eos_token_ids));
  TANDEM_RETURN_IF_ERROR(readDtype(r, &c));
  TANDEM_RETURN_IF_ERROR(readRopeScaling(r, &c.rope_scaling));
  TANDEM_RETURN_IF_ERROR(rejectUnsupportedFeatures(r, c.arch()));
  TANDEM_RETURN_IF_ERROR(rejectSlidingWindow(r, c.arch()));
  TANDEM_RETURN_IF_ERROR(validateShape(r, &c));

  // Mistral-style sliding-window attention is not implemented; capping the
  // context at the window keeps full attention exact for every position the
  // engine will accept. (Qwen2/3 carry a sliding_window number that only
  // use_sliding_window switches on; rejectSlidingWindow refused that.)
  if (c.arch().sliding_window_caps_context) {
    int window = 0;
    TANDEM_RETURN_IF_ERROR(r.optionalPositive("sliding_window", &window));
    if (window > 0 && window < c.max_position_embeddings) c.max_position_embeddings = window;
  }

  if (c.bos_token_id >= c.vocab_size) {
    return r.error("bos_token_id", strCat("must be < vocab_size (", c.vocab_size, "), got ", c.bos_token_id));
  }
  for (TokenId eos : c.eos_token_ids) {
    if (eos >= c.vocab_size) {
      return r.error("eos_token_id", strCat("must be < vocab_size (", c.vocab_size, "), got ", eos));
    }
  }
  return c;
}

std::string modelConfigToJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = c.arch().model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = floatForJson(c.rms_norm_eps);
  j["rope_theta"] = floatForJson(c.rope_theta);
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", floatForJson(c.rope_scaling.factor)},
                         {"low_freq_factor", floatForJson(c.rope_scaling.low_freq_factor)},
                         {"high_freq_factor", floatForJson(c.rope_scaling.high_freq_factor)},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  if (c.arch().has_use_sliding_window) j["use_sliding_window"] = false;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids.front();
  } else {
    j["eos_token_id"] = c.eos_token_ids;
  }
  j["torch_dtype"] = c.torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace tandem::engine
