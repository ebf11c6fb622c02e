// Chat template tests: native ChatML rendering equals jinja2's rendering of the model's own
// template (tests/data/tokenizer/smollm2_chat.jsonl, from tools/record_tokenizer_reference.py);
// other families are refused with a clear error.
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using nlohmann::json;

struct ChatReference {
  json meta;
  std::vector<json> records;
};

ChatReference load_chat_reference() {
  const std::string path = testing::data_path("tokenizer/smollm2_chat.jsonl");
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  ChatReference ref;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j = json::parse(line);
    if (j.contains("meta")) ref.meta = j["meta"];
    else ref.records.push_back(std::move(j));
  }
  return ref;
}

std::vector<ChatMessage> messages_of(const json& j) {
  std::vector<ChatMessage> out;
  for (const json& m : j) out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

TEST(ChatTemplate, MatchesJinjaRenderings) {
  const ChatReference ref = load_chat_reference();
  ASSERT_FALSE(ref.records.empty());
  int checked = 0;
  for (const json& r : ref.records) {
    const std::string tpl = ref.meta["templates"][r["template"].get<std::string>()].get<std::string>();
    auto got = apply_chat_template(tpl, messages_of(r["messages"]), r["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, r["rendered"].get<std::string>())
        << "template " << r["template"] << ", messages " << r["messages"].dump()
        << ", add_generation_prompt " << r["add_generation_prompt"];
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST(ChatTemplate, ReadsTemplateFromGguf) {
  auto gguf = GgufFile::open(testing::default_model_path());
  ASSERT_TRUE(gguf.ok()) << gguf.status().to_string();
  const ChatReference ref = load_chat_reference();
  for (const json& r : ref.records) {
    if (r["template"] != "model") continue;
    auto got = apply_chat_template(*gguf, messages_of(r["messages"]), r["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, r["rendered"].get<std::string>());
  }
}

TEST(ChatTemplate, DefaultModelAddsItsSystemMessage) {
  auto gguf = GgufFile::open(testing::default_model_path());
  ASSERT_TRUE(gguf.ok()) << gguf.status().to_string();
  auto got = apply_chat_template(*gguf, {{"user", "Hi"}}, true);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, PlainChatMlWithoutDefaultSystem) {
  const std::string tpl =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  auto got = apply_chat_template(tpl, {{"user", "x"}}, false);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplate, RefusesOtherFamilies) {
  const std::string llama3 =
      "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
      "message['content'] + '<|eot_id|>' }}{% endfor %}";
  auto a = apply_chat_template(llama3, {{"user", "x"}}, true);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(a.status().message().find("Llama 3"), std::string::npos) << a.status().message();
  EXPECT_EQ(detect_chat_template_family(llama3), ChatTemplateFamily::kLlama3);

  auto b = apply_chat_template("Hello {{ messages }} there", {{"user", "x"}}, true);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(b.status().message().find("Hello {{ messages }}"), std::string::npos) << b.status().message();

  EXPECT_EQ(detect_chat_template_family("{{ '[INST] ' + x + ' [/INST]' }}"), ChatTemplateFamily::kLlama2);
  EXPECT_EQ(detect_chat_template_family("<start_of_turn>user"), ChatTemplateFamily::kGemma);

  auto c = apply_chat_template("", {{"user", "x"}}, true);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specserve
