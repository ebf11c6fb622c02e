// specserve model: chat messages -> prompt text, following the model's own chat template.
//
// GGUF files carry a Jinja2 template (tokenizer.chat_template, from the Hugging Face
// tokenizer_config.json). We do not run Jinja: we recognise the template family and render it
// natively, checked against jinja2's rendering of the real template
// (tests/data/tokenizer/smollm2_chat.jsonl). Supported: ChatML (templates that emit
// "<|im_start|>role\ncontent<|im_end|>\n"), including a default system message that the
// template inserts when the conversation does not start with one (SmolLM2, Qwen2.5).
// Thread-safety: free functions without shared state.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace specserve {

class GgufFile;

/// One turn of a conversation. `role` is usually "system", "user" or "assistant"; ChatML
/// renders any role verbatim.
struct ChatMessage {
  std::string role;
  std::string content;
};

/// Template families we can recognise by their markers.
enum class ChatTemplateFamily { kChatMl, kLlama3, kLlama2, kGemma, kPhi3, kUnknown };

/// The family of `template_text` by its characteristic markers ("<|im_start|>" -> ChatML,
/// "<|start_header_id|>" -> Llama 3, "[INST]" -> Llama 2 / Mistral, "<start_of_turn>" -> Gemma,
/// "<|user|>" -> Phi-3 / Zephyr).
ChatTemplateFamily detect_chat_template_family(const std::string& template_text);

/// Renders `messages` the way `template_text` would under Jinja2, with a trailing
/// "<|im_start|>assistant\n" when add_generation_prompt. Contents are inserted verbatim (special
/// token text in a message is not escaped: tokenize the result with parse_special only when the
/// messages are trusted). Errors: kUnsupported naming the family (or the template's first
/// characters) for anything but ChatML; kInvalidArgument for an empty template.
Expected<std::string> apply_chat_template(const std::string& template_text,
                                          const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt);

/// Same, with the template read from the GGUF key tokenizer.chat_template. Errors: kNotFound
/// when the file has no template; otherwise as above.
Expected<std::string> apply_chat_template(const GgufFile& gguf,
                                          const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt);

}  // namespace specserve
