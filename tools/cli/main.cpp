// The `specserve` command: one binary, one subcommand per job.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "tools/cli/subcommands.h"

int main(int argc, char** argv) {
  CLI::App app{"specserve: LLM serving with speculative decoding"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("specserve ") + SPECSERVE_VERSION, "Print the version and exit");
  specserve::cli::add_generate(app);
  specserve::cli::add_bench_spec(app);
  specserve::cli::add_bench_model(app);
  specserve::cli::add_bench_actors(app);
  specserve::cli::add_bench_http(app);
  specserve::cli::add_bench_kv_transfer(app);
  specserve::cli::add_bench_migrate(app);
  specserve::cli::add_dump_hidden(app);
  specserve::cli::add_cluster_commands(app);
  // CLI11 says only "A subcommand is required" for a mistyped command: name it and the commands.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == word;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "specserve: unknown command '%s'; the commands are: %s (specserve --help)\n", word.c_str(), names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error (a bad flag or value, CLI11's own codes
    // 100-120) exits 2, as bad input does everywhere else in specserve.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    return specserve::cli::run_selected(app);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specserve: error: %s\n", e.what());
    return 1;
  }
}
