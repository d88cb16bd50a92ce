#include "core/model/arch.h"

#include <utility>

#include "core/base/error.h"

namespace duet {
namespace {
constexpr std::pair<Arch, std::string_view> kArchNames[] = {{Arch::llama, "llama"},
                                                            {Arch::qwen2, "qwen2"},
                                                            {Arch::internlm2, "internlm2"},
                                                            {Arch::gemma, "gemma"}};
}  // namespace

std::string_view arch_name(Arch a) {
  for (const auto& [arch, name] : kArchNames) {
    if (arch == a) return name;
  }
  return "?";
}

std::vector<std::string> arch_names() {
  std::vector<std::string> names;
  for (const auto& entry : kArchNames) names.emplace_back(entry.second);
  return names;
}

Arch parse_arch(std::string_view name) {
  for (const auto& [arch, n] : kArchNames) {
    if (n == name) return arch;
  }
  std::string known;
  for (const auto& n : arch_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(Errc::unsupported, "architecture \"" + std::string(name) +
                                     "\" is not one duet runs (known: " + known + ")");
}

}  // namespace duet
