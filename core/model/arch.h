#pragma once
// The model architectures duet runs (GGUF general.architecture), as llama.cpp names them.
#include <string>
#include <string_view>
#include <vector>

namespace duet {

enum class Arch { llama, qwen2, internlm2, gemma };

std::string_view arch_name(Arch a);
std::vector<std::string> arch_names();
// Throws Errc::unsupported naming `name` and listing the known architectures.
Arch parse_arch(std::string_view name);

}  // namespace duet
