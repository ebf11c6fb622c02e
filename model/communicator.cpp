#include "model/communicator.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <unistd.h>

namespace specserve {

Status InProcessStore::set(const std::string& key, const std::vector<char>& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  cv_.notify_all();
  return Status();
}

Expected<std::vector<char>> InProcessStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; })) {
    return deadline_exceeded("rendezvous key '" + key + "' did not appear within " + std::to_string(timeout.count()) +
                             " ms");
  }
  return values_.at(key);
}

std::string FileStore::path_of(const std::string& key) const {
  // Keys may hold '/' (prefixes); anything outside [A-Za-z0-9._-] becomes %XX.
  static const char* hex = "0123456789abcdef";
  std::string name;
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-') {
      name += static_cast<char>(ch);
    } else {
      name += '%';
      name += hex[ch >> 4];
      name += hex[ch & 15];
    }
  }
  return dir_ + "/" + name;
}

Status FileStore::set(const std::string& key, const std::vector<char>& value) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return unavailable("rendezvous folder " + dir_ + ": " + ec.message());
  const std::string path = path_of(key);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!f) return unavailable("rendezvous file " + tmp + ": write failed");
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return unavailable("rendezvous file " + path + ": " + ec.message());
  return Status();
}

Expected<std::vector<char>> FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string path = path_of(key);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f) return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    if (std::chrono::steady_clock::now() >= deadline) {
      return deadline_exceeded("rendezvous key '" + key + "' (" + path + ") did not appear within " +
                               std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace specserve
