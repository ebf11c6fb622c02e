#include "tests/test_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "actors/messages.h"
#include "cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/model_loader.h"
#include "model/tokenizer.h"
#include "spec/engine.h"

namespace specserve::testing {

GgufTensorInfo f32_tensor(const std::vector<float>& data, int64_t rows, int64_t cols) {
  GgufTensorInfo t;
  t.name = "test.weight";
  t.shape = rows == 0 ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
  t.raw_type = static_cast<uint32_t>(GgmlType::F32);
  t.num_elements = static_cast<int64_t>(data.size());
  t.num_bytes = data.size() * sizeof(float);
  t.data = reinterpret_cast<const uint8_t*>(data.data());
  return t;
}

std::string data_path(const std::string& rel) { return std::string(SPECSERVE_SOURCE_DIR) + "/tests/data/" + rel; }

std::string default_model_path() {
  if (const char* env = std::getenv("SPECSERVE_MODEL")) return env;
  return std::string(SPECSERVE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

const GgufFile& default_gguf() {
  static const GgufFile* f = [] {
    auto g = GgufFile::open(default_model_path());
    if (!g.ok()) throw std::runtime_error(g.status().to_string());
    return new GgufFile(std::move(*g));
  }();
  return *f;
}

const Tokenizer& default_tokenizer() {
  static const Tokenizer* t = [] {
    auto k = Tokenizer::from_gguf(default_gguf());
    if (!k.ok()) throw std::runtime_error(k.status().to_string());
    return new Tokenizer(std::move(*k));
  }();
  return *t;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> greedy_reference(const std::vector<int32_t>& prompt, int32_t max_tokens, std::string* text) {
  static std::unique_ptr<Backend> backend = make_cpu_backend(1);
  static LoadedModel m = [] {
    auto l = load_model(default_model_path(), *backend, true);
    if (!l.ok()) throw std::runtime_error("greedy_reference: " + l.status().to_string());
    return std::move(*l);
  }();
  EngineOptions eo;
  eo.max_model_len = 512;
  auto e = Engine::create(*m.model, m.tokenizer.get(), nullptr, eo);
  if (!e.ok()) throw std::runtime_error("greedy_reference: engine: " + e.status().to_string());
  GenerateParams p;
  p.prompt = prompt;
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0;
  p.sampling.ignore_eos = true;
  if (auto id = (*e)->add_request(p); !id.ok()) throw std::runtime_error("greedy_reference: " + id.status().to_string());
  std::vector<int32_t> out;
  std::vector<SeqEvent> ev;
  while ((*e)->has_work()) {
    if (Status st = (*e)->step(&ev); !st.ok()) throw std::runtime_error("greedy_reference: step: " + st.to_string());
  }
  for (const SeqEvent& x : ev) {
    out.insert(out.end(), x.tokens.begin(), x.tokens.end());
    if (text) *text += x.text;
  }
  return out;
}

GenerateRequest greedy_request(const std::vector<int32_t>& prompt, int32_t max_tokens) {
  GenerateRequest r;
  r.prompt_token_ids = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.sampling.ignore_eos = true;
  return r;
}

bool raw_connection_is_closed(const std::string& host, uint16_t port, const std::string& bytes, double timeout_s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return false;
  }
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) == 1) {
      char buf[256];
      closed = ::recv(fd, buf, sizeof buf, 0) <= 0;
    }
  }
  ::close(fd);
  return closed;
}

CliResult run_specserve(const std::string& args, int timeout_s, const std::string& env) {
  CliResult r;
  const std::string prefix =
      (env.empty() ? "" : "env " + env + " ") + (timeout_s > 0 ? "timeout " + std::to_string(timeout_s) + " " : "");
  FILE* f = ::popen((prefix + SPECSERVE_BIN + " " + args + " 2>&1").c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int status = ::pclose(f);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + name + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace specserve::testing
