// lingtrain: the command-line front end. Every stage of training is a subcommand of this one binary
// (cli/commands.h, one file per family of commands); the layers below know nothing of flags or output
// formats.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "dist/communicator.h"
#include "tensor/kernels.h"

int main(int argc, char** argv) {
  // Under mpirun a rank that ends here still ends the others (abort_all_ranks joins the world to do it).
  if (argc < 2) {
    lt::cli::print_usage(stderr);
    lt::abort_all_ranks(2);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "help" || name == "-h") {
    lt::cli::print_usage(stdout);
    return 0;
  }
  const lt::cli::Command command = lt::cli::find_command(name);
  if (!command) {
    std::fprintf(stderr, "lingtrain: error: unknown command '%s' (try lingtrain --help)\n", name.c_str());
    lt::abort_all_ranks(2);
    return 2;
  }
  try {
    lt::cap_cpu_target_from_environment();
    return command(std::vector<std::string>(argv + 2, argv + argc));
  } catch (const lt::cli::HelpRequested& help) {
    std::fputs(help.text.c_str(), stdout);
    return 0;
  } catch (const std::exception& e) {
    // In a multi-process run the line names the rank, and every other rank is ended with it.
    const int rank = lt::process_rank();
    if (rank >= 0) std::fprintf(stderr, "lingtrain: error: rank %d: %s\n", rank, e.what());
    else std::fprintf(stderr, "lingtrain: error: %s\n", e.what());
    std::fflush(stderr);
    lt::abort_all_ranks(1);
    return 1;
  }
}
