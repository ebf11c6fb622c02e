#include "model/model_loader.h"

#include <chrono>

#include "core/logging.h"

namespace specserve {

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
