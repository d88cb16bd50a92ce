#pragma once
// A fresh directory under /tmp for one test (a run dir, a cache, files to read back), removed
// with everything in it when the TempDir goes; TempDirTest, a fixture with one. Header-only.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace duet::test_support {

class TempDir {
 public:
  // Creates /tmp/<prefix>-XXXXXX (mkdtemp: mode 0700, a name no other test holds).
  explicit TempDir(const std::string& prefix) {
    std::string name = "/tmp/" + prefix + "-XXXXXX";
    std::vector<char> tmpl(name.begin(), name.end());
    tmpl.push_back('\0');
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + name);
    path_ = tmpl.data();
  }
  ~TempDir() {
    std::error_code ec;  // a test that failed half-way may have left anything there
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name, as a string (what the APIs under test take).
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A test whose files go in a fresh directory of its own: path(name) is where `name` goes.
class TempDirTest : public ::testing::Test {
 protected:
  explicit TempDirTest(const std::string& prefix) : dir_(prefix) {}
  std::string path(const std::string& name) const { return dir_ / name; }

  TempDir dir_;
};

}  // namespace duet::test_support
