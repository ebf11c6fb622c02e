// specserve core: this process's open file descriptors (Linux /proc/self/fd), for finding a
// socket by what it is connected to when the library that owns it does not say (cpp-httplib's
// connections, CAF's listening socket).
#pragma once

#include <functional>

namespace specserve {

/// The first open descriptor of this process for which `pred(fd)` is true, in /proc/self/fd's
/// order (the directory's own descriptor excluded); -1 when none is, or when /proc/self/fd
/// cannot be read. `pred` is called on the caller's thread; a descriptor may close meanwhile, so
/// `pred` must tolerate failing calls on it.
int find_own_fd(const std::function<bool(int)>& pred);

}  // namespace specserve
