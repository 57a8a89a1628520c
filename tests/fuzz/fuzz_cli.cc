// libFuzzer target: launch's command line (and, through --config, its YAML, and through the
// environment, PET_ variables and a Slurm job step's, its node list among them). The input is the
// arguments, separated by NUL bytes; an argument "%KEY=VALUE" is an environment variable instead; a
// second part after the first "\n---\n" is written to a YAML file that the arguments can name as
// @config. Nothing may crash, hang or abort: every input is a config or one clear error.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "launcher/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  std::string yaml;
  if (auto cut = in.find("\n---\n"); cut != std::string::npos) {
    yaml = in.substr(cut + 5);
    in.resize(cut);
  }
  static const std::string config_path = [] {
    char tmpl[] = "/tmp/launch-fuzz-cli-XXXXXX";
    int fd = ::mkstemp(tmpl);
    if (fd >= 0) ::close(fd);
    return std::string(tmpl);
  }();
  if (FILE* f = std::fopen(config_path.c_str(), "w")) {
    std::fwrite(yaml.data(), 1, yaml.size(), f);
    std::fclose(f);
  }
  std::vector<std::string> argv = {"launch"};
  std::map<std::string, std::string> env;
  size_t start = 0;
  for (size_t i = 0; i <= in.size(); ++i) {
    if (i < in.size() && in[i] != '\0') continue;
    std::string arg = in.substr(start, i - start);
    if (arg == "@config") arg = config_path;
    if (arg.size() > 1 && arg[0] == '%') {
      const size_t eq = arg.find('=');
      env[arg.substr(1, eq == std::string::npos ? std::string::npos : eq - 1)] =
          eq == std::string::npos ? "" : arg.substr(eq + 1);
      start = i + 1;
      continue;
    }
    // --help and --version print a page each: they are covered by the tests, not here.
    if (arg != "--help" && arg != "-h" && arg != "--version") argv.push_back(arg);
    start = i + 1;
  }
  (void)launch::ParseLaunchArgs(argv, env);
  argv[0] = "launch";
  argv.insert(argv.begin() + 1, "coordinator");
  (void)launch::ParseCoordinatorArgs(argv);
  return 0;
}
