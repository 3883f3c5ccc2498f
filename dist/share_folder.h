// A folder that lives on one rank's disk, copied to the other ranks through the communicator: the
// checkpoint rank 0 wrote, when the machines of a run share no filesystem (each rank would otherwise read
// --resume, or the checkpoint a diverged run goes back to, from a disk that lacks it).
#pragma once
#include <string>

#include "dist/communicator.h"

namespace lt {

// Collective. Root reads `folder` (its regular files, recursively); every other rank writes them under
// `local`, a folder of its own (made afresh). Returns the folder each rank reads from: `folder` on root,
// `local` elsewhere. Files travel in pieces of at most 64 MiB, so a rank holds one piece at a time
// whatever the file's size.
std::string share_folder(Communicator& comm, int root, const std::string& folder, const std::string& local);

// root's text on every rank.
void broadcast_text(Communicator& comm, std::string& text, int root);

}  // namespace lt
