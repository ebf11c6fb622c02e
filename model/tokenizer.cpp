// specserve model: byte-level BPE and SentencePiece-style tokenizers over GGUF metadata.
// This file: construction from GGUF / TokenizerSpec (vocabulary, merges, special tokens,
// llama.cpp's fix-ups), the special-token split and encode dispatch, and the queries. The
// algorithms live in tokenizer_bpe.cpp, tokenizer_spm.cpp and pretokenizer.cpp; ids -> text in
// tokenizer_decode.cpp.
//
// Behaviour follows llama.cpp (src/llama-vocab.cpp, src/unicode.cpp) so that ids match
// llama_tokenize exactly; tests/data/tokenizer/ holds llama.cpp's output for a few hundred
// strings. Where llama.cpp would crash or throw we return something reasonable instead and say
// so in a NOTE.
#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <functional>

#include "core/logging.h"
#include "model/gguf.h"
#include "model/pretokenizer.h"
#include "model/tokenizer_internal.h"

namespace specserve {

using namespace tokenizer_internal;

namespace {

uint32_t attr_from_type(int32_t type) {
  switch (static_cast<TokenType>(type)) {
    case TokenType::kUnknown: return kAttrUnknown;
    case TokenType::kUnused: return kAttrUnused;
    case TokenType::kNormal: return kAttrNormal;
    case TokenType::kControl: return kAttrControl;
    case TokenType::kUserDefined: return kAttrUserDefined;
    case TokenType::kByte: return kAttrByte;
    default: return kAttrUndefined;
  }
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

constexpr std::string_view kSpmSpace = "\xe2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

}  // namespace

Expected<Tokenizer> Tokenizer::from_spec(const TokenizerSpec& spec) {
  auto log = get_logger("model");
  const size_t n = spec.tokens.size();
  if (n == 0) return invalid_argument("tokenizer: empty vocabulary (tokenizer.ggml.tokens)");
  if (n > static_cast<size_t>(INT32_MAX / 2)) return invalid_argument("tokenizer: vocabulary too large");
  if (!spec.scores.empty() && spec.scores.size() < n) {
    return invalid_argument("tokenizer: " + std::to_string(spec.scores.size()) + " scores for " +
                            std::to_string(n) + " tokens");
  }
  if (!spec.token_types.empty() && spec.token_types.size() < n) {
    return invalid_argument("tokenizer: " + std::to_string(spec.token_types.size()) +
                            " token types for " + std::to_string(n) + " tokens");
  }

  Tokenizer tok;
  auto tables = std::make_shared<Tables>();
  auto texts = std::make_shared<std::vector<std::string>>(spec.tokens);
  Tables& t = *tables;

  PreConfig pre;
  if (spec.model == "gpt2") {
    tok.kind_ = TokenizerKind::kBpe;
    auto found = lookup_pre(spec.pre);
    if (!found) {
      log->warn("tokenizer: unknown pre-tokenizer '{}', using 'default' (token ids may differ "
                "from the model's own tokenizer)", spec.pre);
      found = lookup_pre("default");
    }
    pre = *found;
  } else if (spec.model == "llama") {
    tok.kind_ = TokenizerKind::kSpm;
    pre.name = "default";
    pre.clean_spaces = false;
    pre.add_bos = true;
  } else {
    return unsupported("tokenizer: tokenizer.ggml.model '" + spec.model +
                       "' is not supported (only 'gpt2' byte-level BPE and 'llama' SentencePiece)");
  }
  tok.pre_name_ = pre.name;
  tok.clean_spaces_ = pre.clean_spaces;
  tok.ignore_merges_ = pre.ignore_merges;
  tok.add_bos_ = spec.add_bos.value_or(pre.add_bos);
  tok.add_eos_ = spec.add_eos.value_or(false);
  tok.add_space_prefix_ = spec.add_space_prefix.value_or(tok.kind_ == TokenizerKind::kSpm);

  // Vocabulary. Duplicate texts: the last id wins, as in llama.cpp's token_to_id.
  t.scores.assign(n, 0.0f);
  if (!spec.scores.empty()) std::copy_n(spec.scores.begin(), n, t.scores.begin());
  t.attrs.assign(n, kAttrNormal);
  if (!spec.token_types.empty()) {
    for (size_t i = 0; i < n; ++i) t.attrs[i] = attr_from_type(spec.token_types[i]);
  }
  t.piece_ids.reserve(n + spec.merges.size() / 4);
  for (size_t i = 0; i < n; ++i) {
    std::string& word = (*texts)[i];
    if (word.empty()) word = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp does
    t.piece_ids[word] = static_cast<int32_t>(i);
  }
  const int32_t n_vocab = static_cast<int32_t>(n);

  if (tok.kind_ == TokenizerKind::kBpe) {
    // Ids for extra pieces must not collide with vocabulary ids even when the vocabulary has
    // duplicate texts (fewer map entries than tokens), so count extras separately.
    int32_t next_extra = n_vocab;
    const auto intern_extra = [&](std::string_view s) -> int32_t {
      auto it = t.piece_ids.find(s);
      if (it != t.piece_ids.end()) return it->second;
      t.piece_ids.emplace(std::string(s), next_extra);
      return next_extra++;
    };
    t.merges.reserve(spec.merges.size());
    for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
      const std::string& m = spec.merges[rank];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) continue;  // llama.cpp files it under ("", ""): never matches
      const std::string_view left(m.data(), sp);
      const std::string_view right(m.data() + sp + 1, m.size() - sp - 1);
      const int32_t l = intern_extra(left);
      const int32_t r = intern_extra(right);
      const int32_t res = intern_extra(std::string(left) + std::string(right));
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
      t.merges.emplace(key, BpeMerge{static_cast<int32_t>(rank), res});  // first rank wins
    }
    const auto byte_to_cpt = make_byte_to_cpt();
    for (int b = 0; b < 256; ++b) {
      append_utf8(byte_to_cpt[b], t.byte_encoded[b]);
      t.cpt_to_byte[byte_to_cpt[b]] = static_cast<uint8_t>(b);
      auto it = t.piece_ids.find(t.byte_encoded[b]);
      t.byte_piece[b] = it == t.piece_ids.end() ? -1 : it->second;
    }
    for (const std::string& expr : pre.regexes) {
      const std::string pattern = to_pcre(expr);
      int err = 0;
      PCRE2_SIZE err_off = 0;
      pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                       PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
      if (code == nullptr) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return internal_error("tokenizer: pre-tokenizer regex '" + expr + "' does not compile at " +
                              std::to_string(err_off) + ": " + reinterpret_cast<const char*>(msg));
      }
      pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
      t.regexes.emplace_back(code);
    }
  }

  // Special ids: kind defaults, dropped when outside the vocabulary, then metadata overrides.
  int32_t bos = -1, eos = -1, unk = -1;
  if (tok.kind_ == TokenizerKind::kSpm) {
    bos = 1; eos = 2; unk = 0;
  } else {
    bos = 11; eos = 11;
  }
  int32_t eot = -1, eom = -1, sep = -1, pad = -1, mask = -1;
  int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  const auto apply = [&](const char* name, const std::optional<int32_t>& given, int32_t& id) {
    if (id >= n_vocab) id = -1;
    if (!given) return;
    if (*given < 0 || *given >= n_vocab) {
      log->warn("tokenizer: bad special token {} = {}, using default id {}", name, *given, id);
    } else {
      id = *given;
    }
  };
  const SpecialTokenIds& s = spec.special;
  apply("bos", s.bos, bos); apply("eos", s.eos, eos); apply("eot", s.eot, eot);
  apply("eom", s.eom, eom); apply("unk", s.unk, unk); apply("sep", s.sep, sep);
  apply("pad", s.pad, pad); apply("mask", s.mask, mask);
  apply("fim_pre", s.fim_pre, fim_pre); apply("fim_suf", s.fim_suf, fim_suf);
  apply("fim_mid", s.fim_mid, fim_mid); apply("fim_pad", s.fim_pad, fim_pad);
  apply("fim_rep", s.fim_rep, fim_rep); apply("fim_sep", s.fim_sep, fim_sep);

  // Ids found by text when the metadata has none (llama.cpp's "auto-detect special tokens by
  // text"). Such tokens become control tokens.
  // NOTE: llama.cpp walks an unordered_map, so with several candidates (SmolLM has both
  // <|im_end|> and <|endoftext|>) which one becomes the EOT id is unspecified; we take the first
  // candidate in list order. Both are end-of-generation either way.
  const auto detect = [&](int32_t& id, std::initializer_list<const char*> names) {
    if (id != -1) return;
    for (const char* name : names) {
      auto it = t.piece_ids.find(std::string_view(name));
      if (it == t.piece_ids.end() || it->second >= n_vocab) continue;
      id = it->second;
      t.attrs[id] |= kAttrControl;
      return;
    }
  };
  detect(eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
               "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
               "<end_of_utterance>"});
  detect(eom, {"<|eom_id|>"});
  detect(fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                   "▁<PRE>", "<|code_prefix|>", "<|prefix|>"});
  detect(fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                   "▁<SUF>", "<|code_suffix|>", "<|suffix|>"});
  detect(fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                   "▁<MID>", "<|code_middle|>", "<|middle|>"});
  detect(fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect(fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect(fim_sep, {"<|file_sep|>"});

  // Control tokens whose text says "unused" are unused.
  for (int32_t i = 0; i < n_vocab; ++i) {
    if ((t.attrs[i] & kAttrControl) && (*texts)[i].find("unused") != std::string::npos) {
      t.attrs[i] |= kAttrUnused;
    }
  }

  // End-of-generation set.
  std::set<int32_t> eog;
  for (int32_t id : {fim_pad, fim_rep, fim_sep}) {
    if (id != -1) eog.insert(id);
  }
  static const std::set<std::string_view> kEogTexts = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
      "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
      "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
      "<｜end▁of▁sentence｜>", "[e~["};
  for (const auto& [text, id] : t.piece_ids) {
    if (id >= n_vocab || kEogTexts.count(text) == 0) continue;
    eog.insert(id);
    t.attrs[id] |= kAttrControl;
  }
  for (int32_t id : {eos, eot, eom}) {
    if (id != -1) eog.insert(id);
  }
  {
    // o200k_harmony / solar-open: <|end|> is not EOG when <|return|>+<|call|> (or
    // <|calls|>+<|flush|>) exist. gemma4 / plamo: </s> is an ordinary token.
    const auto has = [&](std::string_view txt) {
      return std::any_of(eog.begin(), eog.end(), [&](int32_t id) { return (*texts)[id] == txt; });
    };
    const auto find_in = [&](std::string_view txt) {
      for (int32_t id : eog) if ((*texts)[id] == txt) return id;
      return -1;
    };
    if (has("<|end|>") && ((has("<|return|>") && has("<|call|>")) ||
                           (has("<|calls|>") && has("<|flush|>")))) {
      const int32_t id = find_in("<|end|>");
      eog.erase(id);
      t.attrs[id] = kAttrUserDefined;
    }
    if (has("</s>") && (has("<|tool_response>") || has("<|plamo:eos|>"))) {
      const int32_t id = find_in("</s>");
      eog.erase(id);
      t.attrs[id] = kAttrNormal;
    }
  }

  tok.tokens_ = texts;
  tok.bos_id_ = bos;
  tok.eos_id_ = eos;
  tok.eot_id_ = eot;
  tok.eom_id_ = eom;
  tok.unk_id_ = unk;
  tok.pad_id_ = pad;
  tok.eog_ids_ = std::move(eog);

  // Special tokens, longest first, cut out of the text before tokenizing.
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (t.attrs[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) t.special_tokens.push_back(i);
  }
  std::stable_sort(t.special_tokens.begin(), t.special_tokens.end(), [&](int32_t a, int32_t b) {
    return (*texts)[a].size() > (*texts)[b].size();
  });

  // Per-model strip rules (llama.cpp keys these off general.name).
  std::string name_lower = spec.model_name;
  std::transform(name_lower.begin(), name_lower.end(), name_lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name_lower.find("phi-3") != std::string::npos || name_lower.find("phi3") != std::string::npos) {
    for (int32_t id : t.special_tokens) t.attrs[id] |= kAttrRstrip;
    const auto set_rstrip = [&](std::string_view txt, bool on) {
      auto it = t.piece_ids.find(txt);
      if (it == t.piece_ids.end() || it->second >= n_vocab) return;
      if (on) t.attrs[it->second] |= kAttrRstrip;
      else t.attrs[it->second] &= ~kAttrRstrip;
    };
    set_rstrip("</s>", true);
    for (auto txt : {"<unk>", "<s>", "<|endoftext|>"}) set_rstrip(txt, false);
  }

  tok.t_ = tables;
  // Piece cache (special = true), as llama.cpp builds cache_token_to_piece.
  tables->pieces.resize(n);
  for (int32_t i = 0; i < n_vocab; ++i) {
    const std::string& text = (*texts)[i];
    const uint32_t attr = t.attrs[i];
    std::string piece;
    if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
      piece = text;
    } else if (attr & kAttrNormal) {
      if (tok.kind_ == TokenizerKind::kSpm) {
        piece = text;
        replace_all(piece, kSpmSpace, " ");
      } else {
        // Undo the byte->unicode mapping; a code point outside it is reported in-line the way
        // llama_decode_text does.
        size_t off = 0;
        while (off < text.size()) {
          const uint32_t cpt = decode_cpt(text, off);
          auto it = t.cpt_to_byte.find(cpt);
          if (it != t.cpt_to_byte.end()) {
            piece.push_back(static_cast<char>(it->second));
          } else {
            std::string utf8;
            append_utf8(cpt, utf8);
            piece += "[UNK_BYTE_0x";
            static const char* kHex = "0123456789abcdef";
            for (unsigned char c : utf8) {
              piece.push_back(kHex[c >> 4]);
              piece.push_back(kHex[c & 15]);
            }
            piece += text + "]";
          }
        }
      }
    } else if (attr & kAttrByte) {
      // "<0xNN>": the byte itself.
      if (text.size() >= 5) piece.push_back(static_cast<char>(std::strtol(text.substr(3, 2).c_str(), nullptr, 16)));
    }
    tables->pieces[i] = std::move(piece);
  }
  return tok;
}

Expected<Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) {
  auto spec = spec_from_gguf(gguf);
  if (!spec.ok()) return spec.status();
  return from_spec(*spec);
}

Expected<TokenizerSpec> Tokenizer::spec_from_gguf(const GgufFile& gguf) {
  TokenizerSpec spec;
  auto model = gguf.get_string("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  spec.model = *model;
  if (gguf.has("tokenizer.ggml.pre")) {
    auto pre = gguf.get_string("tokenizer.ggml.pre");
    if (!pre.ok()) return pre.status();
    spec.pre = *pre;
  }
  auto tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  spec.tokens = std::move(*tokens);
  if (gguf.has("tokenizer.ggml.scores")) {
    auto scores = gguf.get_float_array("tokenizer.ggml.scores");
    if (!scores.ok()) return scores.status();
    spec.scores.assign(scores->begin(), scores->end());
  }
  if (gguf.has("tokenizer.ggml.token_type")) {
    auto types = gguf.get_int_array("tokenizer.ggml.token_type");
    if (!types.ok()) return types.status();
    spec.token_types.assign(types->begin(), types->end());
  }
  if (spec.model == "gpt2") {
    auto merges = gguf.get_string_array("tokenizer.ggml.merges");
    if (!merges.ok()) return merges.status();
    spec.merges = std::move(*merges);
  }
  const auto read_id = [&](const char* key, std::optional<int32_t>& out) -> Status {
    if (!gguf.has(key)) return Status();
    auto v = gguf.get_int(key);
    if (!v.ok()) return v.status();
    out = (*v < INT32_MIN || *v > INT32_MAX) ? -1 : static_cast<int32_t>(*v);
    return Status();
  };
  SpecialTokenIds& s = spec.special;
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.bos_token_id", s.bos));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.eos_token_id", s.eos));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.eot_token_id", s.eot));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.eom_token_id", s.eom));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.unknown_token_id", s.unk));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.seperator_token_id", s.sep));  // sic (GGUF spelling)
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.padding_token_id", s.pad));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.mask_token_id", s.mask));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_pre_token_id", s.fim_pre));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_suf_token_id", s.fim_suf));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_mid_token_id", s.fim_mid));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_pad_token_id", s.fim_pad));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_rep_token_id", s.fim_rep));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_sep_token_id", s.fim_sep));
  // Deprecated spellings of the FIM ids.
  if (!s.fim_pre) SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.prefix_token_id", s.fim_pre));
  if (!s.fim_suf) SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.suffix_token_id", s.fim_suf));
  if (!s.fim_mid) SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.middle_token_id", s.fim_mid));
  const auto read_bool = [&](const char* key, std::optional<bool>& out) -> Status {
    if (!gguf.has(key)) return Status();
    auto v = gguf.get_bool(key);
    if (!v.ok()) return v.status();
    out = *v;
    return Status();
  };
  SPECSERVE_RETURN_IF_ERROR(read_bool("tokenizer.ggml.add_bos_token", spec.add_bos));
  SPECSERVE_RETURN_IF_ERROR(read_bool("tokenizer.ggml.add_eos_token", spec.add_eos));
  SPECSERVE_RETURN_IF_ERROR(read_bool("tokenizer.ggml.add_space_prefix", spec.add_space_prefix));
  if (gguf.has("general.name")) {
    auto name = gguf.get_string("general.name");
    if (name.ok()) spec.model_name = *name;
  }
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Encoding

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Tables& t = *t_;
  const auto& texts = *tokens_;

  // Cut special tokens out of the text (llama.cpp's tokenizer_st_partition). A fragment is a
  // token id, or (-1, offset, length) of raw text.
  struct Fragment {
    int32_t token;
    size_t off, len;
  };
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t special : t.special_tokens) {
    const uint32_t attr = t.attrs[special];
    if (!parse_special && (attr & (kAttrControl | kAttrUnknown))) continue;
    const std::string& st = texts[special];
    bool any = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0 || f.len < st.size()) continue;
      if (text.substr(f.off, f.len).find(st) != std::string_view::npos) { any = true; break; }
    }
    if (!any) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) { next.push_back(f); continue; }
      size_t base = f.off, len = f.len;
      while (true) {
        const size_t m = text.substr(0, base + len).find(st, base);
        if (m == std::string_view::npos) {
          if (len > 0) next.push_back({-1, base, len});
          break;
        }
        if (m > base) {
          size_t left_len = m - base;
          if (attr & kAttrLstrip) {
            while (left_len > 0 && std::isspace(static_cast<unsigned char>(text[base + left_len - 1]))) --left_len;
          }
          if (left_len > 0) next.push_back({-1, base, left_len});
        }
        next.push_back({special, 0, 0});
        if (m + st.size() >= base + len) break;
        size_t right = m + st.size();
        size_t right_len = base + len - right;
        if (attr & kAttrRstrip) {
          while (right_len > 0 && std::isspace(static_cast<unsigned char>(text[right]))) { ++right; --right_len; }
        }
        base = right;
        len = right_len;
      }
    }
    frags.swap(next);
  }

  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (kind_ == TokenizerKind::kSpm) {
    if (add_special && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
    bool prev_special = true;  // a space is prefixed to the first raw fragment
    std::string piece;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      piece.clear();
      if (add_space_prefix_ && prev_special) piece.push_back(' ');
      piece.append(text.substr(f.off, f.len));
      replace_all(piece, " ", kSpmSpace);
      encode_spm(piece, out);
      prev_special = false;
    }
    if (add_special && add_eos_ && eos_id_ >= 0) out.push_back(eos_id_);
  } else {
    if (add_special && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
    for (const Fragment& f : frags) {
      if (f.token >= 0) out.push_back(f.token);
      else encode_bpe(text.substr(f.off, f.len), out);
    }
    if (add_special && add_eos_ && eos_id_ >= 0) out.push_back(eos_id_);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Queries

int32_t Tokenizer::find_token(std::string_view text) const {
  auto it = t_->piece_ids.find(text);
  if (it == t_->piece_ids.end() || it->second >= vocab_size()) return -1;
  return it->second;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  SPECSERVE_CHECK(id >= 0 && id < vocab_size(), "token id " + std::to_string(id) + " out of range");
  return (*tokens_)[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUndefined;
  const uint32_t a = t_->attrs[id];
  if (a & kAttrControl) return TokenType::kControl;
  if (a & kAttrUserDefined) return TokenType::kUserDefined;
  if (a & kAttrUnknown) return TokenType::kUnknown;
  if (a & kAttrByte) return TokenType::kByte;
  if (a & kAttrUnused) return TokenType::kUnused;
  if (a & kAttrNormal) return TokenType::kNormal;
  return TokenType::kUndefined;
}

}  // namespace specserve
