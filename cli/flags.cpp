#include "cli/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "dist/communicator.h"
#include "tensor/cores.h"
#include "tensor/error.h"
#include "tensor/threadpool.h"

namespace lt::cli {

bool is_help_flag(const std::string& arg) { return arg == "--help" || arg == "-h"; }

Flags::Flags(const std::string& usage, const std::vector<FlagSpec>& specs, const std::vector<std::string>& args) {
  std::map<std::string, FlagSpec::Kind> kinds;
  for (const FlagSpec& spec : specs) {
    values_[spec.name] = spec.default_value;
    kinds[spec.name] = spec.kind;
  }
  auto takes_value = [&](const std::string& name) {
    const auto it = kinds.find(name);
    return it == kinds.end() || it->second != FlagSpec::Switch;
  };
  // Help first, wherever it stands among the flags: a help request is never refused for another flag.
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_help_flag(args[i])) throw HelpRequested{help_text(usage, specs)};
    if (args[i].rfind("--", 0) == 0 && args[i].find('=') == std::string::npos && takes_value(args[i].substr(2))) ++i;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) fail("unexpected argument '", arg, "'");
    std::string name = arg.substr(2), value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (!takes_value(name)) {
      value = "1";
    } else {
      if (i + 1 >= args.size()) fail("flag --", name, " needs a value");
      value = args[++i];
    }
    if (!values_.count(name)) fail("unknown flag --", name);
    values_[name] = value;  // the last one wins (make's *_FLAGS override the Makefile's own)
    if (kinds.at(name) == FlagSpec::Repeatable) lists_[name].push_back(value);
    set_.insert(name);
  }
}

const std::vector<std::string>& Flags::list(const std::string& name) const {
  static const std::vector<std::string> none;
  const auto it = lists_.find(name);
  return it == lists_.end() ? none : it->second;
}

long long Flags::integer(const std::string& name) const {
  const std::string& v = str(name);
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') fail("flag --", name, " needs an integer, got '", v, "'");
  if (errno == ERANGE) fail("flag --", name, " is out of range: '", v, "'");
  return parsed;
}

long long Flags::positive(const std::string& name) const {
  const long long v = integer(name);
  if (v <= 0) fail("flag --", name, " must be > 0, got ", v);
  return v;
}

double Flags::number(const std::string& name) const {
  const std::string& v = str(name);
  char* end = nullptr;
  const double parsed = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(parsed)) fail("flag --", name, " needs a number, got '", v, "'");
  return parsed;
}

bool Flags::on_off(const std::string& name) const {
  const std::string& v = str(name);
  if (v != "on" && v != "off") fail("flag --", name, " needs on or off, got '", v, "'");
  return v == "on";
}

std::string help_text(const std::string& usage, const std::vector<FlagSpec>& specs) {
  // One line per flag: --name=DEFAULT (as it would be typed), then its help in a column.
  constexpr size_t kHelpColumn = 30;
  std::string text = usage + "\nflags:\n";
  for (const FlagSpec& spec : specs) {
    std::string flag = "  --" + spec.name + (spec.default_value.empty() ? "" : "=" + spec.default_value);
    if (spec.kind == FlagSpec::Repeatable) flag += " ...";
    text += flag + std::string(flag.size() < kHelpColumn ? kHelpColumn - flag.size() : 1, ' ') + spec.help + "\n";
  }
  return text;
}

FlagsAndPositionals split_positionals(const std::vector<std::string>& args) {
  FlagsAndPositionals out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_help_flag(args[i])) {
      out.flags.push_back(args[i]);
    } else if (args[i].rfind("--", 0) == 0) {
      out.flags.push_back(args[i]);
      if (args[i].find('=') == std::string::npos && i + 1 < args.size()) out.flags.push_back(args[++i]);
    } else {
      out.positionals.push_back(args[i]);
    }
  }
  return out;
}

FlagSpec threads_flag() {
  return {"threads", "0", "threads (0: one per core this process may use, shared with the ranks on this machine)"};
}

void apply_threads(const Flags& flags) {
  const long long threads = flags.integer("threads");
  if (threads < 0) fail("flag --threads must be >= 0, got ", threads);
  set_num_threads(threads > 0 ? static_cast<int>(threads) : default_threads(processes_on_this_machine()));
}

kernels::MatmulPrecision matmul_precision_from_flag(const std::string& dtype) {
  if (dtype == "f32") return kernels::MatmulPrecision::F32;
  if (dtype == "bf16") return kernels::MatmulPrecision::BF16Inputs;
  if (dtype == "tf32") return kernels::MatmulPrecision::TF32;
  fail("flag --dtype must be f32, bf16 or tf32, got '", dtype, "'");
}

}  // namespace lt::cli
