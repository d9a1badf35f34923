#include "engine/model/model_config.h"

#include <charconv>
#include <cstdlib>
#include <limits>

#include <nlohmann/json.hpp>

#include "src/common/strings.h"

namespace tandem::engine {
namespace {

using Json = nlohmann::json;

// Architectures whose checkpoints have exactly the tensors and math this
// engine implements (RMSNorm, RoPE, GQA attention without biases, SwiGLU).
constexpr std::string_view kSupportedArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM"};
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
  FieldReader(const Json& root, std::string_view source) : root_(root), source_(source) {}

  absl::Status error(std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(strCat(source_, ": ", field, ": ", what));
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

  // A token id, or (eos_token_id in newer configs) a list of them: the first
  // one is the id the tokenizer appends; the engine stops on it.
  absl::Status optionalTokenId(std::string_view field, TokenId* out) const {
    const Json* j = get(field);
    if (j == nullptr) return absl::OkStatus();
    const Json* value = j;
    if (j->is_array()) {
      if (j->empty()) return error(field, "expected an integer or a non-empty list of integers, got []");
      value = &(*j)[0];
    }
    TANDEM_ASSIGN_OR_RETURN(int id, intValue(field, *value));
    if (id < 0) return error(field, strCat("must be >= 0, got ", id));
    *out = id;
    return absl::OkStatus();
  }

 private:
  absl::Status positiveValue(std::string_view field, const Json& j, int* out) const {
    TANDEM_ASSIGN_OR_RETURN(int v, intValue(field, j));
    if (v <= 0) return error(field, strCat("must be positive, got ", v));
    *out = v;
    return absl::OkStatus();
  }

  const Json& root_;
  std::string_view source_;
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
    for (std::string_view supported : kSupportedArchitectures) {
      if (name == supported) {
        c->architecture = name;
        return absl::OkStatus();
      }
    }
    seen += seen.empty() ? name : strCat(", ", name);
  }
  return r.error("architectures", strCat("unsupported architecture [", seen,
                                         "]; this engine runs LlamaForCausalLM and MistralForCausalLM"));
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
absl::Status rejectUnsupportedFeatures(const FieldReader& r) {
  for (std::string_view flag : {"attention_bias", "mlp_bias"}) {
    bool on = false;
    TANDEM_RETURN_IF_ERROR(r.optionalBool(flag, &on));
    if (on) return r.error(flag, "biases in projections are not supported");
  }
  if (const Json* scaling = r.get("rope_scaling"); scaling != nullptr) {
    return r.error("rope_scaling", strCat("not supported (got ", scaling->dump(), ")"));
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
  TANDEM_RETURN_IF_ERROR(r.optionalTokenId("eos_token_id", &c.eos_token_id));
  TANDEM_RETURN_IF_ERROR(readDtype(r, &c));
  TANDEM_RETURN_IF_ERROR(rejectUnsupportedFeatures(r));
  TANDEM_RETURN_IF_ERROR(validateShape(r, &c));

  // Mistral-style sliding-window attention is not implemented; capping the
  // context at the window keeps full attention exact for every position the
  // engine will accept.
  int window = 0;
  TANDEM_RETURN_IF_ERROR(r.optionalPositive("sliding_window", &window));
  if (window > 0 && window < c.max_position_embeddings) c.max_position_embeddings = window;

  if (c.bos_token_id >= c.vocab_size) {
    return r.error("bos_token_id", strCat("must be < vocab_size (", c.vocab_size, "), got ", c.bos_token_id));
  }
  if (c.eos_token_id >= c.vocab_size) {
    return r.error("eos_token_id", strCat("must be < vocab_size (", c.vocab_size, "), got ", c.eos_token_id));
  }
  return c;
}

std::string modelConfigToJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = c.architecture == "MistralForCausalLM" ? "mistral" : "llama";
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
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = c.torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace tandem::engine
