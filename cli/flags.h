// The one flag parser of every command: flags of the form --name value or --name=value, each declared
// with its default and a line of help, so a typo is an error instead of a silently ignored option, and
// `lingtrain CMD --help` (or -h) prints the command's flags.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tensor/kernel_types.h"

namespace lt::cli {

struct FlagSpec {
  enum Kind {
    Value,       // --name value
    Switch,      // means "1" on its own (--json)
    Repeatable,  // may be given more than once; every value is kept, in order (Flags::list)
  };
  std::string name;
  std::string default_value;
  std::string help;
  Kind kind = Value;
};

// Thrown by the parser on --help or -h: the command's help text, which main prints to stdout (exit 0).
struct HelpRequested {
  std::string text;
};

class Flags {
 public:
  // `usage`: the first lines of the command's help (what it does, how it is called).
  Flags(const std::string& usage, const std::vector<FlagSpec>& specs, const std::vector<std::string>& args);

  const std::vector<std::string>& list(const std::string& name) const;
  bool was_set(const std::string& name) const { return set_.count(name) > 0; }
  const std::string& str(const std::string& name) const { return values_.at(name); }
  long long integer(const std::string& name) const;
  long long positive(const std::string& name) const;  // an integer > 0
  double number(const std::string& name) const;        // a finite number
  bool on_off(const std::string& name) const;          // "on" or "off"

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> lists_;
  std::set<std::string> set_;
};

// The help text of a command: its usage, then each flag as --name=DEFAULT with its help.
std::string help_text(const std::string& usage, const std::vector<FlagSpec>& specs);
bool is_help_flag(const std::string& arg);  // --help or -h

// Splits "--flag value" pairs from the positional arguments (files, texts) between and after them.
struct FlagsAndPositionals {
  std::vector<std::string> flags, positionals;
};
FlagsAndPositionals split_positionals(const std::vector<std::string>& args);

// --threads, which most commands take.
FlagSpec threads_flag();
// --threads 0 (the default): one thread per core this process may use, shared with the other processes
// an MPI launcher started on this machine.
void apply_threads(const Flags& flags);
// --dtype: f32, bf16 (mixed precision: the matmuls take bf16 operands on a GPU or a CPU with
// AVX512_BF16, everything else f32), or tf32 (a GPU mode: f32 matmuls on the tensor cores as TF32;
// plain f32 on a CPU).
kernels::MatmulPrecision matmul_precision_from_flag(const std::string& dtype);

}  // namespace lt::cli
