#include "core/own_fds.h"

#include <dirent.h>

#include <cstdlib>

namespace specserve {

int find_own_fd(const std::function<bool(int)>& pred) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    if (pred(static_cast<int>(fd))) {
      found = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(dir);
  return found;
}

}  // namespace specserve
