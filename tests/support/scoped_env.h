#pragma once
// Sets an environment variable for its lifetime (what a setting's reader sees, core/base/
// settings.h); the value it had before is put back (or the variable removed) when it goes.
#include <cstdlib>
#include <optional>
#include <string>

namespace duet::test_support {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace duet::test_support
