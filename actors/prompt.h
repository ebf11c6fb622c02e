// specserve actors: a request's prompt in token space — the one place where `prompt`,
// `messages` and `prompt_token_ids` of a GenerateRequest become token ids — and PromptCodec,
// the served model's text side as a front end (server/) sees it.
//
// The head's scheduler calls it for every SubmitMsg, and a front end (the OpenAI HTTP server)
// may call it first to count prompt tokens or refuse a request before it is submitted: both
// then agree token for token and error for error. Pure: no actors, no I/O; thread-safe (the
// GGUF and tokenizer are read only).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/messages.h"
#include "core/status.h"

namespace specserve {

class GgufFile;
class Tokenizer;

/// The prompt of `request` as token ids:
///  - `prompt_token_ids`: used as given, after a vocabulary check;
///  - `messages`: rendered with the GGUF's chat template (apply_chat_template, generation
///    prompt added), then encoded with add_special = true and parse_special = true (the
///    template's own special tokens become their ids);
///  - `prompt`: encoded with add_special = true (the model's BOS rule) and parse_special = true:
///    special-token text such as "<|im_start|>" becomes its id, as vLLM's and llama.cpp's
///    completion endpoints read a prompt (a raw chat-formatted prompt works).
/// `gguf` holds the chat template, `tokenizer` the target's vocabulary.
/// Errors, with the field named:
///  - kInvalidArgument "request: give exactly one of prompt, messages, prompt_token_ids (got N)";
///  - kOutOfRange "prompt: B bytes / M messages / T token ids is more than any context holds"
///    (over 16 MiB of text, 2^22 token ids or 100000 messages);
///  - kInvalidArgument "prompt_token_ids[I]: token id X is outside the vocabulary (size V)" (I: its index);
///  - "messages: ..." with the chat template's own code and message;
///  - kInvalidArgument "prompt: empty after tokenization".
/// Nothing here knows max_model_len: the context limit is the caller's (it depends on the
/// replicas).
/// How text becomes ids (vLLM's request fields of the same names): add_special applies the
/// model's BOS rule to prompt text and rendered chats; add_generation_prompt ends a rendered
/// chat with the assistant's prompt.
struct PromptOptions {
  bool add_special = true;
  bool add_generation_prompt = true;
};
Expected<std::vector<int32_t>> tokenize_prompt(const GgufFile& gguf, const Tokenizer& tokenizer,
                                               const GenerateRequest& request, const PromptOptions& options = {});

/// The served model's tokenizer and chat template behind the few calls a front end makes
/// (DESIGN.md: server/ includes actors/ and config/, not model/). A view: copies share the
/// GGUF and tokenizer, which must outlive it; read-only and thread-safe. Every call but
/// loaded() needs loaded(). Token ids are the target's; text is UTF-8 bytes as the tokenizer
/// produces them (a piece may be part of a UTF-8 sequence).
class PromptCodec {
 public:
  PromptCodec() = default;  ///< no model: loaded() is false
  PromptCodec(const GgufFile& gguf, const Tokenizer& tokenizer) : gguf_(&gguf), tokenizer_(&tokenizer) {}

  /// True when it views a GGUF and a tokenizer (every other call aborts otherwise).
  bool loaded() const { return gguf_ != nullptr && tokenizer_ != nullptr; }
  /// tokenize_prompt(gguf, tokenizer, request, options): the ids the scheduler will see, same errors.
  Expected<std::vector<int32_t>> tokenize(const GenerateRequest& request, const PromptOptions& options = {}) const;
  /// `text` encoded with parse_special = true (special-token text becomes its id, as in
  /// tokenize_prompt); add_special: the model's BOS rule.
  std::vector<int32_t> encode(std::string_view text, bool add_special) const;
  /// `turns` rendered with the GGUF's chat template (model/chat_template.h), a trailing
  /// assistant prompt when add_generation_prompt. Errors: the template's, as "messages: ...".
  Expected<std::string> render_chat(const std::vector<ChatTurn>& turns, bool add_generation_prompt) const;
  /// `ids` as text, special tokens rendered (Tokenizer::decode(ids, special = true)); an id
  /// outside the vocabulary decodes to nothing.
  std::string decode(const std::vector<int32_t>& ids) const;
  /// The bytes id decodes to alone, special tokens rendered (Tokenizer::token_to_piece); "" for
  /// an id outside the vocabulary.
  std::string token_piece(int32_t id) const;
  /// The vocabulary's own text of id (Tokenizer::token_text; GPT-2 byte-encoded for BPE).
  /// Aborts when id is outside 0 .. vocab_size()-1.
  const std::string& token_text(int32_t id) const;
  /// Token ids are 0 .. vocab_size()-1.
  int32_t vocab_size() const;

 private:
  const Tokenizer& tok() const;  ///< aborts unless loaded()
  const GgufFile* gguf_ = nullptr;
  const Tokenizer* tokenizer_ = nullptr;
};

}  // namespace specserve
