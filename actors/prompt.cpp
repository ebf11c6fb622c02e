#include "actors/prompt.h"

#include <string>

#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace specserve {

Expected<std::vector<int32_t>> tokenize_prompt(const GgufFile& gguf, const Tokenizer& tokenizer,
                                               const GenerateRequest& req, const PromptOptions& options) {
  const int n = (!req.prompt.empty()) + (!req.messages.empty()) + (!req.prompt_token_ids.empty());
  if (n != 1) return invalid_argument("request: give exactly one of prompt, messages, prompt_token_ids (got " + std::to_string(n) + ")");
  // NOTE: caps on the raw input before any tokenizing, so a huge request costs nothing: no
  // context holds 16 MiB of text, 4M token ids or 100000 turns.
  size_t bytes = req.prompt.size();
  for (const ChatTurn& t : req.messages) bytes += t.content.size() + t.role.size();
  constexpr size_t kMaxPromptBytes = size_t{16} << 20;
  if (bytes > kMaxPromptBytes || req.prompt_token_ids.size() > (size_t{1} << 22) || req.messages.size() > 100000) {
    return out_of_range("prompt: " + std::to_string(bytes) + " bytes / " + std::to_string(req.messages.size()) +
                        " messages / " + std::to_string(req.prompt_token_ids.size()) + " token ids is more than any context holds");
  }
  std::vector<int32_t> ids;
  if (!req.prompt_token_ids.empty()) {
    const int32_t vocab = tokenizer.vocab_size();
    for (size_t i = 0; i < req.prompt_token_ids.size(); ++i) {
      const int32_t t = req.prompt_token_ids[i];
      if (t < 0 || t >= vocab) {
        // (the index: "prompt_token_ids[1]: token id ..." says which of the prompt's ids)
        return invalid_argument("prompt_token_ids[" + std::to_string(i) + "]: token id " + std::to_string(t) +
                                " is outside the vocabulary (size " + std::to_string(vocab) + ")");
      }
    }
    ids = req.prompt_token_ids;
  } else if (!req.messages.empty()) {
    auto text = PromptCodec(gguf, tokenizer).render_chat(req.messages, options.add_generation_prompt);
    if (!text.ok()) return text.status();
    ids = tokenizer.encode(*text, options.add_special, /*parse_special=*/true);
  } else {
    ids = tokenizer.encode(req.prompt, options.add_special, /*parse_special=*/true);
  }
  if (ids.empty()) return invalid_argument("prompt: empty after tokenization");
  return ids;
}

const Tokenizer& PromptCodec::tok() const {
  SPECSERVE_CHECK(loaded(), "PromptCodec used without a GGUF and tokenizer");
  return *tokenizer_;
}

Expected<std::vector<int32_t>> PromptCodec::tokenize(const GenerateRequest& request, const PromptOptions& options) const {
  const Tokenizer& t = tok();
  return tokenize_prompt(*gguf_, t, request, options);
}

std::vector<int32_t> PromptCodec::encode(std::string_view text, bool add_special) const {
  return tok().encode(text, add_special, /*parse_special=*/true);
}

Expected<std::string> PromptCodec::render_chat(const std::vector<ChatTurn>& turns, bool add_generation_prompt) const {
  SPECSERVE_CHECK(loaded(), "PromptCodec used without a GGUF and tokenizer");
  std::vector<ChatMessage> msgs;
  msgs.reserve(turns.size());
  for (const ChatTurn& t : turns) msgs.push_back({t.role, t.content});
  auto text = apply_chat_template(*gguf_, msgs, add_generation_prompt);
  if (!text.ok()) return Status(text.status().code(), "messages: " + text.status().message());
  return text;
}

std::string PromptCodec::decode(const std::vector<int32_t>& ids) const { return tok().decode(ids, /*special=*/true); }

std::string PromptCodec::token_piece(int32_t id) const { return tok().token_to_piece(id, /*special=*/true); }

const std::string& PromptCodec::token_text(int32_t id) const { return tok().token_text(id); }

int32_t PromptCodec::vocab_size() const { return tok().vocab_size(); }

}  // namespace specserve
