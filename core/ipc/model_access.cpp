#include "core/ipc/model_access.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/ipc/stack_models.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

std::mutex g_mu;
std::vector<std::string> g_dirs;

std::string canonical_or_given(const std::string& p) {
  std::error_code ec;
  const fs::path c = fs::canonical(p, ec);
  return ec ? p : c.string();
}

}  // namespace

void allow_model_dirs(const std::vector<std::string>& dirs) {
  std::vector<std::string> resolved;
  for (const std::string& d : dirs)
    if (!d.empty()) resolved.push_back(canonical_or_given(d));
  std::lock_guard lock(g_mu);
  g_dirs = std::move(resolved);
}

std::vector<std::string> model_dirs_for(const std::string& model_path,
                                        const std::vector<std::string>& extra_dirs) {
  std::vector<std::string> dirs;
  // The stack's models (issue 25: every one of DUET_MODELS, else --model's).
  for (const ServedModel& m : stack_models(model_path)) {
    dirs.push_back(fs::absolute(m.path).parent_path().string());
    // A model may be a link (models/fortune-q8_0.gguf is): its file's directory too.
    std::error_code ec;
    const fs::path real = fs::canonical(m.path, ec);
    if (!ec) dirs.push_back(real.parent_path().string());
  }
  dirs.insert(dirs.end(), extra_dirs.begin(), extra_dirs.end());
  if (const auto env = setting_override("DUET_MODEL_DIRS")) {
    std::stringstream ss(*env);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty()) dirs.push_back(d);
  }
  return dirs;
}

const std::vector<std::string>& allowed_model_dirs() {
  std::lock_guard lock(g_mu);
  return g_dirs;
}

void check_model_path(const std::string& path) {
  std::vector<std::string> dirs;
  {
    std::lock_guard lock(g_mu);
    dirs = g_dirs;
  }
  if (dirs.empty()) return;
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  if (ec) throw Error(Errc::not_found, "model '" + path + "': " + ec.message());
  for (const std::string& d : dirs) {
    const std::string dir = d.back() == '/' ? d : d + "/";
    if (real.string().rfind(dir, 0) == 0) return;
  }
  std::string list;
  for (const std::string& d : dirs) list += (list.empty() ? "" : ", ") + d;
  throw Error(Errc::invalid_argument,
              "model '" + path + "' is outside the allowed model directories (" + list + ")");
}

}  // namespace duet
