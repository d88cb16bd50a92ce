// build/bin/duet: the command line. Verbs are stable once an issue names them (add, don't rename).
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "core/base/error.h"

int main(int argc, char** argv) {
  CLI::App app{"duet: heterogeneous GPU+NPU LLM inference"};
  app.require_subcommand(1);
  for (auto& install : duet::cli::command_installers()) install(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const duet::Error& e) {
    std::fprintf(stderr, "duet: error [%s]: %s\n", std::string(duet::errc_name(e.code())).c_str(),
                 e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "duet: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
