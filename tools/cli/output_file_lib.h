// specserve CLI: the result files benchmarks write (--output / --out).
#pragma once

#include <string>

#include "core/status.h"

namespace specserve::cli {

/// Checks, before a run, that `path` can be written: an existing regular file that is writable,
/// or a new name in an existing, writable directory (a file of that name is created and removed
/// at once to be sure). Nothing is left behind. `flag` names the option
/// in the error (kInvalidArgument: "--output /x/y.json: directory /x does not exist").
/// NOTE: benchmarks run for minutes; a results path that cannot be written used to be found
/// only at the end (and bench-spec, bench-actors and bench-model then said "wrote" anyway).
Status check_output_file(const std::string& flag, const std::string& path);

/// Checks, before a run, that `path` can be written by replacing it (a temporary file in its
/// folder renamed over it: --ready-file): its folder exists and can be written in, and `path`
/// is not a directory. Whether an existing file is itself writable does not matter. Nothing is
/// created. Errors as check_output_file's.
Status check_replaceable_file(const std::string& flag, const std::string& path);

/// Writes `text` to `path` (truncating it); kUnavailable naming `flag`, the path and errno's
/// text when the file cannot be opened or the write fails (a full disk included).
Status write_output_file(const std::string& flag, const std::string& path, const std::string& text);

}  // namespace specserve::cli
