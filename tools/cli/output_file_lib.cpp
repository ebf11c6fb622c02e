// See output_file_lib.h.
#include "tools/cli/output_file_lib.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace specserve::cli {

namespace fs = std::filesystem;

Status check_output_file(const std::string& flag, const std::string& path) {
  const std::string what = flag + " " + path + ": ";
  if (path.empty()) return invalid_argument(flag + ": an empty path");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st)) {
    if (fs::is_directory(st)) return invalid_argument(what + "is a directory (give a file name)");
    if (::access(path.c_str(), W_OK) != 0) return invalid_argument(what + "cannot be written: " + std::strerror(errno));
    return Status();
  }
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const fs::file_status ds = fs::status(dir, ec);
  if (!fs::exists(ds)) return invalid_argument(what + "directory " + dir.string() + " does not exist");
  if (!fs::is_directory(ds)) return invalid_argument(what + dir.string() + " is not a directory");
  if (::access(dir.c_str(), W_OK) != 0) {
    return invalid_argument(what + "cannot create a file in " + dir.string() + ": " + std::strerror(errno));
  }
  // The file itself, created and removed at once: access() says yes to root everywhere, and a
  // directory of a file system that takes no new files (/proc, /sys, one mounted read-only for
  // files only) passed.
  // NOTE: `bench --output-json /proc/x` ran its whole benchmark and failed writing at the end.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) {
      // A symbolic link to nothing (fs::status saw no file): the write would follow it into a
      // folder never checked. Otherwise the file appeared meanwhile: written over at the end.
      if (fs::is_symlink(fs::symlink_status(path, ec))) {
        return invalid_argument(what + "is a symbolic link to a missing file (" +
                                fs::read_symlink(path, ec).string() + "): give the file itself");
      }
      return Status();
    }
    return invalid_argument(what + "cannot create a file in " + dir.string() + ": " + std::strerror(errno));
  }
  ::close(fd);
  ::unlink(path.c_str());
  return Status();
}

Status check_replaceable_file(const std::string& flag, const std::string& path) {
  const std::string what = flag + " " + path + ": ";
  if (path.empty()) return invalid_argument(flag + ": an empty path");
  std::error_code ec;
  if (fs::is_directory(path, ec)) return invalid_argument(what + "is a directory (give a file name)");
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const fs::file_status ds = fs::status(dir, ec);
  if (!fs::exists(ds)) return invalid_argument(what + "directory " + dir.string() + " does not exist");
  if (!fs::is_directory(ds)) return invalid_argument(what + dir.string() + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return invalid_argument(what + "cannot create a file in " + dir.string() + ": " + std::strerror(errno));
  }
  return Status();
}

Status write_output_file(const std::string& flag, const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return unavailable(flag + " " + path + ": cannot open for writing: " + std::strerror(errno));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !closed) {
    return unavailable(flag + " " + path + ": write failed: " + std::strerror(wrote ? errno : write_errno));
  }
  return Status();
}

}  // namespace specserve::cli
