// lingtrain: the command-line front end. Every stage of training is a subcommand of this one binary;
// the layers below know nothing of flags or output formats.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

namespace {

using lt::fail;

// Flags of the form --name value or --name=value; every flag a command reads must be declared, so a
// typo is an error instead of a silently ignored option.
class Flags {
 public:
  Flags(std::vector<std::string> args, std::map<std::string, std::string> defaults) : values_(std::move(defaults)) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& arg = args[i];
      if (arg.rfind("--", 0) != 0) fail("unexpected argument '", arg, "'");
      std::string name = arg.substr(2), value;
      if (const size_t eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else {
        if (i + 1 >= args.size()) fail("flag --", name, " needs a value");
        value = args[++i];
      }
      if (!values_.count(name)) fail("unknown flag --", name);
      values_[name] = value;
    }
  }
  const std::string& str(const std::string& name) const { return values_.at(name); }
  long long integer(const std::string& name) const {
    const std::string& v = str(name);
    char* end = nullptr;
    const long long parsed = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') fail("flag --", name, " needs an integer, got '", v, "'");
    return parsed;
  }

 private:
  std::map<std::string, std::string> values_;
};

void apply_threads(const Flags& flags) {
  const long long threads = flags.integer("threads");
  if (threads < 0) fail("flag --threads must be >= 0, got ", threads);
  lt::set_num_threads(static_cast<int>(threads));
}

int cmd_version(const std::vector<std::string>& args) {
  Flags flags(args, {{"threads", "0"}});
  apply_threads(flags);
  std::printf("lingtrain %s\n", LINGTRAIN_VERSION);
  std::printf("cpu kernels: Highway %s\n", lt::cpu_kernel_target());
  std::printf("threads: %d\n", lt::num_threads());
  if (lt::cuda_compiled()) std::printf("cuda: compiled in, %d device(s) found\n", lt::cuda_device_count());
  else std::printf("cuda: not compiled in\n");
  return 0;
}

// Runs every gradient check and prints one line per op (the worst case of its variants).
int cmd_gradcheck(const std::vector<std::string>& args) {
  Flags flags(args, {{"threads", "0"}, {"op", ""}, {"verbose", "0"}});
  apply_threads(flags);
  const std::string only = flags.str("op");
  const bool verbose = flags.integer("verbose") != 0;
  std::vector<std::string> order;
  std::map<std::string, lt::GradCheckResult> worst;
  for (const lt::GradCase& c : lt::core_gradcheck_cases()) {
    if (!only.empty() && c.op != only) continue;
    const lt::GradCheckResult r = lt::gradcheck(c);
    if (verbose)
      std::printf("  %s [%s] max_abs=%.3e max_rel=%.3e %s\n", r.op.c_str(), r.variant.c_str(), r.max_abs, r.max_rel,
                  r.pass ? "PASS" : "FAIL");
    auto [it, inserted] = worst.try_emplace(c.op, r);
    if (inserted) {
      order.push_back(c.op);
      continue;
    }
    lt::GradCheckResult& w = it->second;
    w.max_abs = std::max(w.max_abs, r.max_abs);
    w.max_rel = std::max(w.max_rel, r.max_rel);
    w.pass = w.pass && r.pass;
  }
  if (order.empty()) fail("gradcheck: no op named '", only, "'");
  int failed = 0;
  for (const std::string& op : order) {
    const lt::GradCheckResult& r = worst[op];
    std::printf("%s max_abs=%.3e max_rel=%.3e %s\n", op.c_str(), r.max_abs, r.max_rel, r.pass ? "PASS" : "FAIL");
    failed += r.pass ? 0 : 1;
  }
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

void usage(FILE* out) {
  std::fprintf(out,
               "usage: lingtrain <command> [flags]\n"
               "  --version                      version, CPU kernel target, threads, CUDA\n"
               "  gradcheck [--op NAME] [--verbose 1] [--threads N]\n"
               "                                 finite-difference check of every op's backward\n");
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::function<int(const std::vector<std::string>&)>> commands = {
      {"--version", cmd_version}, {"version", cmd_version}, {"gradcheck", cmd_gradcheck}};
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "help" || name == "-h") {
    usage(stdout);
    return 0;
  }
  const auto command = commands.find(name);
  if (command == commands.end()) {
    std::fprintf(stderr, "lingtrain: error: unknown command '%s' (try lingtrain --help)\n", name.c_str());
    return 2;
  }
  try {
    return command->second(std::vector<std::string>(argv + 2, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lingtrain: error: %s\n", e.what());
    return 1;
  }
}
