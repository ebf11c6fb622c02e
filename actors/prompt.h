// specserve actors: a request's prompt in token space — the one place where `prompt`,
// `messages` and `prompt_token_ids` of a GenerateRequest become token ids.
//
// The head's scheduler calls it for every SubmitMsg, and a front end (the OpenAI HTTP server)
// may call it first to count prompt tokens or refuse a request before it is submitted: both
// then agree token for token and error for error. Pure: no actors, no I/O; thread-safe (the
// GGUF and tokenizer are read only).
#pragma once

#include <cstdint>
#include <vector>

#include "actors/messages.h"
#include "core/status.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace specserve {

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
///  - kInvalidArgument "prompt_token_ids: token id X is outside the vocabulary (size V)";
///  - "messages: ..." with the chat template's own code and message;
///  - kInvalidArgument "prompt: empty after tokenization".
/// Nothing here knows max_model_len: the context limit is the caller's (it depends on the
/// replicas).
Expected<std::vector<int32_t>> tokenize_prompt(const GgufFile& gguf, const Tokenizer& tokenizer,
                                               const GenerateRequest& request);

}  // namespace specserve
