// The terminal a stream writes to: whether there is one, and its width (the progress line, the inspect
// tables).
#pragma once
#include <cstdio>

namespace lt {

bool is_terminal(std::FILE* stream);
// The width in columns of the terminal `stream` writes to; 0 when it is not a terminal (a file, a pipe)
// or does not say.
int terminal_columns(std::FILE* stream);

}  // namespace lt
