# Writes OUTPUT, a C++ file holding the text of every PRESET_DIR/*.json as a raw string literal, so the
# binary finds its model presets from any working directory. Runs at build time:
#   cmake -DPRESET_DIR=<dir> -DOUTPUT=<file.cpp> -P embed_presets.cmake
# A raw string ends at `)delimiter"`; a file containing that sequence would end the literal early, so
# such a file is refused here instead of producing C++ that fails to compile or, worse, compiles.
cmake_minimum_required(VERSION 3.25)

set(delimiter "lingtrain_json")
file(GLOB preset_files LIST_DIRECTORIES false "${PRESET_DIR}/*.json")
list(SORT preset_files)
if(NOT preset_files)
  message(FATAL_ERROR "embed_presets: no *.json in ${PRESET_DIR}")
endif()

set(entries "")
foreach(file ${preset_files})
  get_filename_component(name "${file}" NAME_WLE)
  if(NOT name MATCHES "^[a-z0-9][a-z0-9.-]*$")
    message(FATAL_ERROR "embed_presets: ${file}: a preset name may hold only a-z, 0-9, '.' and '-'")
  endif()
  file(READ "${file}" text)
  string(FIND "${text}" ")${delimiter}\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "embed_presets: ${file} contains ')${delimiter}\"', which would end its C++ raw string")
  endif()
  string(APPEND entries "    {\"${name}\", R\"${delimiter}(${text})${delimiter}\"},\n")
endforeach()

file(CONFIGURE OUTPUT "${OUTPUT}" @ONLY CONTENT [=[
// Generated at build time by cmake/embed_presets.cmake from model/presets/*.json: edit those files.
#include "model/preset_texts.h"

namespace lt {

std::span<const PresetText> preset_texts() {
  static constexpr PresetText texts[] = {
@entries@  };
  return texts;
}

}  // namespace lt
]=])
