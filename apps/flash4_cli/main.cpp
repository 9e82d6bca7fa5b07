// The `flash4` command-line tool. `flash4 --help` documents it.
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>

#include "flash4/api.h"
#include "options.h"
#include "run.h"

namespace {

bool is_help(const char* arg) {
  return std::strcmp(arg, "--help") == 0 || std::strcmp(arg, "-h") == 0 || std::strcmp(arg, "help") == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(flash4_cli::help_text(), stderr);
    return 2;
  }
  if (is_help(argv[1])) {
    std::fputs(flash4_cli::help_text(), stdout);
    return 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("flash4 %s\n", flash4::version());
    return 0;
  }
  if (std::strcmp(argv[1], "run") != 0) {
    std::fprintf(stderr, "flash4: unknown command '%s'; run 'flash4 --help' for usage\n", argv[1]);
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    if (is_help(argv[i])) {
      std::fputs(flash4_cli::help_text(), stdout);
      return 0;
    }
  }
  try {
    return flash4_cli::run_attention(flash4_cli::parse_run_options(argc - 2, argv + 2));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "flash4: %s; run 'flash4 --help' for usage\n", e.what());
    return 2;
  } catch (const flash4::Error& e) {
    std::fprintf(stderr, "flash4: error (%s): %s\n", flash4::status_name(e.status()), e.what());
    return e.status() == flash4::Status::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flash4: error: %s\n", e.what());
    return 1;
  }
}
