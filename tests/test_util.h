// Helpers shared by the tests: where the source tree, test data and default model are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specserve {
struct GgufTensorInfo;
class GgufFile;
class Tokenizer;
struct GenerateRequest;
}  // namespace specserve

namespace specserve::testing {

/// A GGUF F32 tensor "test.weight" over `data` (not copied: it must outlive the result) for
/// Backend::load_weight: [rows, cols] (GGUF shape {cols, rows}), or a vector of cols when rows == 0.
GgufTensorInfo f32_tensor(const std::vector<float>& data, int64_t rows, int64_t cols);

/// Absolute path of the source tree's tests/data/<rel>.
std::string data_path(const std::string& rel);

/// Path of the default model (SPECSERVE_MODEL, else <source>/models/SmolLM2-135M-Instruct.Q4_1.gguf).
/// The README's test command fetches it first; a test needing it fails (not skips) without it.
std::string default_model_path();

/// The default model's GGUF file and tokenizer, opened once per test process and kept open.
/// Throws std::runtime_error naming the path when the model cannot be read (GoogleTest reports
/// it as the test's failure).
const GgufFile& default_gguf();
const Tokenizer& default_tokenizer();

/// Greedy tokens of the default model alone (the oracle of output-identity tests): an Engine with
/// no proposer, max_model_len 512, on one CPU thread (the model loaded once per test process),
/// `prompt` [n] token ids, `max_tokens` output tokens with ignore_eos. `*text` (when given) gets
/// the streamed text appended. Throws std::runtime_error naming the failed step.
std::vector<int32_t> greedy_reference(const std::vector<int32_t>& prompt, int32_t max_tokens, std::string* text = nullptr);

/// A greedy request (temperature 0, ignore_eos) of `max_tokens` tokens for `prompt` [n] token ids:
/// what the output-identity tests submit through the client API.
GenerateRequest greedy_request(const std::vector<int32_t>& prompt, int32_t max_tokens);

/// Reads a whole file; aborts the test with a message when it cannot.
std::string read_file(const std::string& path);

/// Connects to 127.0.0.1-style `host`:`port`, sends `bytes`, and waits up to `timeout_s` for the
/// peer to close the connection (EOF or reset; whatever it answers first is read and dropped).
/// False when it could not connect or the connection stayed open.
bool raw_connection_is_closed(const std::string& host, uint16_t port, const std::string& bytes, double timeout_s = 10);

/// What a run of the specserve binary gave.
struct CliResult {
  int exit_code = -1;  ///< the exit status; -1 when it did not exit normally
  std::string out;     ///< stdout and stderr together
};
/// Runs `SPECSERVE_BIN args` through the shell, stderr into stdout. `timeout_s` > 0: killed
/// after that long (coreutils timeout: exit code 124). `env`: "NAME=VALUE ..." set for the
/// command alone.
CliResult run_specserve(const std::string& args, int timeout_s = 0, const std::string& env = "");

/// A fresh directory for one test's files: gtest's TempDir() + `name` + this process's pid
/// (created with its parents; the test removes it).
std::string temp_dir(const std::string& name);

}  // namespace specserve::testing
