// The `specserve` command: one binary, one subcommand per job.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "tools/cli/subcommands.h"

int main(int argc, char** argv) {
  CLI::App app{"specserve: LLM serving with speculative decoding"};
  app.require_subcommand(1);
  specserve::cli::add_generate(app);
  specserve::cli::add_bench_spec(app);
  specserve::cli::add_bench_model(app);
  specserve::cli::add_bench_actors(app);
  specserve::cli::add_bench_http(app);
  specserve::cli::add_bench_kv_transfer(app);
  specserve::cli::add_bench_migrate(app);
  specserve::cli::add_dump_hidden(app);
  specserve::cli::add_cluster_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return specserve::cli::run_selected(app);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specserve: error: %s\n", e.what());
    return 1;
  }
}
