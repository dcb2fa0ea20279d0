// Checks that outputs can be written, made before any work starts, so that a run is never lost
// to a bad output path discovered at its end.
#pragma once

#include <string>

namespace ft {

// A file can be created at `path`: its directory exists and accepts a new file (probed by
// creating and removing `path`.tmp.<pid>), and `path` is not a directory. Throws ft::Error
// naming `what` (e.g. "--save") and the reason. An existing file at `path` is left untouched.
void check_writable_file(const std::string& path, const std::string& what);

// Creates `dir` and its parents when missing, then checks that a file can be written inside.
// Throws ft::Error naming `what` (e.g. "--out-dir") and the reason.
void prepare_output_dir(const std::string& dir, const std::string& what);

}  // namespace ft
