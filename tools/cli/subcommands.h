// specserve CLI: each subcommand registers its options on the app and runs when selected.
#pragma once

#include <CLI/CLI.hpp>

namespace specserve::cli {

/// `specserve generate`: one prompt, streamed to stdout, with timing and speculative stats.
void add_generate(CLI::App& app);

/// Runs the subcommand the user chose; returns the process exit code.
int run_selected(CLI::App& app);

}  // namespace specserve::cli
