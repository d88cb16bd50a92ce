// The SoC profile the paper's figures are held against (deploy/soc/sd8gen3.toml), loaded once.
#pragma once

#include <string>

#include "core/planner/soc_profile.h"

namespace duet::test_support {

inline const SocProfile& sd8gen3() {
  static const SocProfile soc =
      load_soc_profile(std::string(DUET_SOURCE_DIR) + "/deploy/soc/sd8gen3.toml");
  return soc;
}

}  // namespace duet::test_support
