// specserve model: native rendering of recognised chat-template families.
#include "model/chat_template.h"

#include <regex>
#include <string_view>

#include "model/gguf.h"

namespace specserve {

namespace {

// A string literal inside a Jinja tag ({{ ... }} or {% ... %}): its unescaped value and where it
// starts in the template.
struct Literal {
  std::string value;
  size_t pos;
};

// Collects the string literals of every Jinja tag. Python/Jinja escapes \n \t \r \\ \' \" are
// decoded; any other backslash pair is kept as written (as Jinja does).
std::vector<Literal> jinja_literals(std::string_view tpl) {
  std::vector<Literal> out;
  size_t i = 0;
  while (i + 1 < tpl.size()) {
    if (tpl[i] != '{' || (tpl[i + 1] != '{' && tpl[i + 1] != '%')) {
      ++i;
      continue;
    }
    const char close = tpl[i + 1] == '{' ? '}' : '%';
    i += 2;
    while (i + 1 < tpl.size() && !(tpl[i] == close && tpl[i + 1] == '}')) {
      const char q = tpl[i];
      if (q != '\'' && q != '"') {
        ++i;
        continue;
      }
      Literal lit{{}, i};
      ++i;
      while (i < tpl.size() && tpl[i] != q) {
        if (tpl[i] == '\\' && i + 1 < tpl.size()) {
          const char e = tpl[i + 1];
          switch (e) {
            case 'n': lit.value += '\n'; break;
            case 't': lit.value += '\t'; break;
            case 'r': lit.value += '\r'; break;
            case '\\': lit.value += '\\'; break;
            case '\'': lit.value += '\''; break;
            case '"': lit.value += '"'; break;
            default: lit.value += '\\'; lit.value += e; break;
          }
          i += 2;
          continue;
        }
        lit.value += tpl[i++];
      }
      ++i;  // closing quote
      out.push_back(std::move(lit));
    }
    i += 2;
  }
  return out;
}

const char* family_name(ChatTemplateFamily f) {
  switch (f) {
    case ChatTemplateFamily::kChatMl: return "ChatML";
    case ChatTemplateFamily::kLlama3: return "Llama 3";
    case ChatTemplateFamily::kLlama2: return "Llama 2 / Mistral [INST]";
    case ChatTemplateFamily::kGemma: return "Gemma";
    case ChatTemplateFamily::kPhi3: return "Phi-3 / Zephyr";
    case ChatTemplateFamily::kUnknown: return "unknown";
  }
  return "unknown";
}

std::string trim_ws(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

}  // namespace

ChatTemplateFamily detect_chat_template_family(const std::string& tpl) {
  if (tpl.find("<|im_start|>") != std::string::npos) return ChatTemplateFamily::kChatMl;
  if (tpl.find("<|start_header_id|>") != std::string::npos) return ChatTemplateFamily::kLlama3;
  if (tpl.find("<start_of_turn>") != std::string::npos) return ChatTemplateFamily::kGemma;
  if (tpl.find("[INST]") != std::string::npos) return ChatTemplateFamily::kLlama2;
  if (tpl.find("<|user|>") != std::string::npos) return ChatTemplateFamily::kPhi3;
  return ChatTemplateFamily::kUnknown;
}

Expected<std::string> apply_chat_template(const std::string& tpl, const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt) {
  if (tpl.empty()) return invalid_argument("chat template: empty template");
  const ChatTemplateFamily family = detect_chat_template_family(tpl);
  if (family != ChatTemplateFamily::kChatMl) {
    std::string head = tpl.substr(0, 48);
    for (char& c : head) if (c == '\n') c = ' ';
    return unsupported(std::string("chat template: ") + family_name(family) +
                       " templates are not supported (only ChatML '<|im_start|>'); template begins '" +
                       head + (tpl.size() > 48 ? "...'" : "'"));
  }

  // A default system turn is a literal "<|im_start|>system\n...<|im_end|>" the template emits
  // when the conversation does not open with a system message. Inside the message loop (SmolLM2:
  // `loop.first and messages[0]['role'] != 'system'`) it needs at least one message; outside it
  // (Qwen2.5) it is emitted even for an empty conversation.
  std::string default_system;
  bool default_needs_messages = false;
  const size_t loop_begin = tpl.find("for message in messages");
  const size_t loop_end = tpl.find("endfor", loop_begin == std::string::npos ? 0 : loop_begin);
  for (const Literal& lit : jinja_literals(tpl)) {
    static constexpr std::string_view kHead = "<|im_start|>system";
    if (lit.value.compare(0, kHead.size(), kHead) != 0) continue;
    if (lit.value.find("<|im_end|>") == std::string::npos) continue;  // a prefix to concatenate
    default_system = lit.value;
    if (default_system.size() >= 10 && default_system.compare(default_system.size() - 10, 10, "<|im_end|>") == 0) {
      default_system += '\n';
    }
    default_needs_messages = loop_begin != std::string::npos && lit.pos > loop_begin &&
                             (loop_end == std::string::npos || lit.pos < loop_end);
    break;
  }
  // Some ChatML templates trim message contents (`message['content'] | trim`).
  static const std::regex kTrim(R"(content['"]?\]?\s*\|\s*trim)");
  const bool trim = std::regex_search(tpl, kTrim);

  std::string out;
  const bool first_is_system = !messages.empty() && messages[0].role == "system";
  if (!default_system.empty() && !first_is_system && (!default_needs_messages || !messages.empty())) {
    out += default_system;
  }
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>";
    out += m.role;
    out += '\n';
    out += trim ? trim_ws(m.content) : m.content;
    out += "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

Expected<std::string> apply_chat_template(const GgufFile& gguf, const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt) {
  if (!gguf.has("tokenizer.chat_template")) {
    return not_found(gguf.path() + ": no tokenizer.chat_template in the GGUF metadata");
  }
  auto tpl = gguf.get_string("tokenizer.chat_template");
  if (!tpl.ok()) return tpl.status();
  return apply_chat_template(*tpl, messages, add_generation_prompt);
}

}  // namespace specserve
