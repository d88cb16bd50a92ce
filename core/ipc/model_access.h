#pragma once
// Which model files a process may open on a peer's say-so. A RegisterProgram, an Eval or a
// PlanRequest names a model path; a service opens it only if it lies (after resolving symlinks
// and "..") inside one of the configured model directories: the directory of the stack's own
// --model, every --model-dir, and DUET_MODEL_DIRS (colon-separated). With none configured (a
// library used directly, as in unit tests) every path is allowed.
#include <string>
#include <vector>

namespace duet {

// Replaces the allowed directories (each resolved to its canonical path; missing ones are kept
// as given so they can never match a real file by accident).
void allow_model_dirs(const std::vector<std::string>& dirs);
// The directories of service_main's options: dirname(--model), --model-dir..., DUET_MODEL_DIRS.
std::vector<std::string> model_dirs_for(const std::string& model_path,
                                        const std::vector<std::string>& extra_dirs);
const std::vector<std::string>& allowed_model_dirs();

// Throws Error(invalid_argument) naming the path and the allowed directories when the path is
// outside them, or Error(not_found) when it does not exist.
void check_model_path(const std::string& path);

}  // namespace duet
