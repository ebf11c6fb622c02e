// See dump_hidden_dir_lib.h.
#include "tools/cli/dump_hidden_dir_lib.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <vector>

namespace specserve::cli::dump_dir {
namespace fs = std::filesystem;
namespace {

/// The files of a dump, index.json last (DumpHiddenOptions::out_dir: it marks a whole dump).
std::vector<std::string> dump_files(bool write_weights) {
  std::vector<std::string> f = {"hidden.npy", "tokens.npy", "argmax.npy"};
  if (write_weights) f.insert(f.end(), {"head.npy", "embed.npy"});
  f.push_back("index.json");
  return f;
}

// True when no process `pid` runs: none exists, or it is a zombie (killed, not yet reaped by
// its parent).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;  // (EPERM: alive, another user's)
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');  // "pid (comm) S ...": comm may hold spaces and parentheses
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

}  // namespace

Status publish(const fs::path& tmp, const fs::path& out, bool write_weights) {
  std::error_code ec;
  fs::remove(out / "index.json", ec);
  if (ec) return internal_error("dump-hidden: cannot remove the previous " + (out / "index.json").string() + ": " + ec.message());
  // NOTE: a dump --no-weights over one with weights left the old head.npy / embed.npy beside
  // it, which the trainers then read as this dump's (of another model, perhaps).
  if (!write_weights) {
    for (const char* name : {"head.npy", "embed.npy"}) {
      fs::remove(out / name, ec);
      if (ec) return internal_error("dump-hidden: cannot remove the previous " + (out / name).string() + ": " + ec.message());
    }
  }
  for (const std::string& name : dump_files(write_weights)) {
    fs::rename(tmp / name, out / name, ec);
    if (ec) return internal_error("dump-hidden: cannot move " + (tmp / name).string() + " to " + (out / name).string() + ": " + ec.message());
  }
  return Status();
}

std::string partial_prefix() {
  char buf[256] = {};
  std::string host = "host";
  if (::gethostname(buf, sizeof buf - 1) == 0 && buf[0] != '\0') host = buf;
  for (char& ch : host) {
    if (ch == '/') ch = '_';
  }
  return ".dump-hidden.partial-" + host + "-";
}

// NOTE: the partial dumps of killed processes were left behind for good, each up to a whole
// dump in size; a process id is judged on its own host only (a shared file system).
void remove_dead_partials(const fs::path& out, const std::string& prefix) {
  std::error_code ec;
  for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(digits));
    if (pid <= 0 || !process_gone(pid)) continue;
    std::error_code ignored;
    fs::remove_all(it->path(), ignored);
    std::fprintf(stderr, "[dump-hidden] removed %s: a partial dump of process %d, which is gone\n", it->path().c_str(),
                 static_cast<int>(pid));
  }
}

}  // namespace specserve::cli::dump_dir
