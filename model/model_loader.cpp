#include "model/model_loader.h"

#include <chrono>

#include "core/logging.h"
#include "model/model_config.h"

namespace specserve {

Status check_not_head_file(const GgufFile& file) {
  const GgufValue* v = file.find("general.architecture");
  const std::string* arch = v ? std::get_if<std::string>(&v->v) : nullptr;
  if (!arch || (*arch != "medusa" && *arch != "eagle")) return Status();
  const std::string& p = file.path();
  // "an eagle", "a medusa"
  return invalid_argument(p + ": this is " + (*arch == "eagle" ? "an " : "a ") + *arch + " head (general.architecture=" + *arch +
                          "), not a model that runs on its own (a target or a draft model); pass it in --speculative-config '{\"method\": \"" + *arch +
                          "\", \"model\": \"" + p + "\", \"num_speculative_tokens\": K}' (YAML: models.speculative.model) "
                          "with the model it was trained on as the target");
}

Status check_model_file(const GgufFile& file) {
  SPECSERVE_RETURN_IF_ERROR(check_not_head_file(file));
  auto c = ModelConfig::from_gguf(file);
  return c.ok() ? Status() : c.status();
}

Expected<LoadedModel> load_model(const std::string& path, Backend& backend, bool quiet, const LoadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel m;
  auto f = GgufFile::open(path);
  if (!f.ok()) {
    if (f.status().code() == StatusCode::kNotFound && path.find("SmolLM2-135M-Instruct") != std::string::npos) {
      return not_found(f.status().message() + " (run scripts/fetch-model.sh to fetch the default model)");
    }
    return f.status();
  }
  // Before the tokenizer: a head file has none, and "tokenizer.ggml.model missing" would not
  // tell the user that they passed a head where a model goes.
  SPECSERVE_RETURN_IF_ERROR(check_not_head_file(*f));
  m.file = std::make_unique<GgufFile>(std::move(*f));
  auto tok = Tokenizer::from_gguf(*m.file);
  if (!tok.ok()) return tok.status();
  m.tokenizer = std::make_unique<Tokenizer>(std::move(*tok));
  auto model = Transformer::load(*m.file, backend, options);
  if (!model.ok()) return model.status();
  m.model = std::move(*model);
  m.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!quiet) {
    const auto& c = m.model->config();
    get_logger("model")->info("loaded {} ({}: {} layers, hidden {}, {} heads / {} kv heads, vocab {}, ctx {}) in {:.2f} s on {}",
                            path, c.arch, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size,
                            c.context_length, m.load_seconds, backend.name());
  }
  return m;
}

}  // namespace specserve
