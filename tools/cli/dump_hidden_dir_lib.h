// specserve tools: the output directory of `specserve dump-hidden` (tools/cli/dump_hidden_lib.h
// DumpHiddenOptions::out_dir): a finished dump moved into place whole, and the partial dumps of
// processes that are gone removed.
#pragma once

#include <filesystem>
#include <string>

#include "core/status.h"

namespace specserve::cli::dump_dir {

/// Moves the files of the complete dump in `tmp` into `out`: removes out/index.json first, so a
/// dump half-replaced by a failure here is never read as whole; without `write_weights` a
/// previous dump's head.npy and embed.npy go too. Errors: kInternal naming the file.
Status publish(const std::filesystem::path& tmp, const std::filesystem::path& out, bool write_weights);

/// ".dump-hidden.partial-HOST-": the name of a dump's temporary directory in --out, before its
/// process id. HOST is this host's name ("host" when it has none).
std::string partial_prefix();

/// Removes the directories `prefix` + PID in `out` whose process is gone (none with that id on
/// this host, or a zombie: killed outright, SIGKILL, a crash, the OOM killer), saying so on
/// stderr. Other names (another host's prefix) are left alone. Errors are ignored (a directory
/// that cannot be read or removed stays).
void remove_dead_partials(const std::filesystem::path& out, const std::string& prefix);

}  // namespace specserve::cli::dump_dir
