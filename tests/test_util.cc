#include "tests/test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace launch::testing {

Child::Child(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env, int stdin_fd) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) std::abort();
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  for (const auto& kv : extra_env) {
    std::string key = kv.substr(0, kv.find('='));
    for (auto it = env.begin(); it != env.end();) {
      it = it->compare(0, key.size() + 1, key + "=") == 0 ? env.erase(it) : it + 1;
    }
    if (kv.find('=') != std::string::npos) env.push_back(kv);  // "KEY" alone unsets
  }
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);
    if (stdin_fd >= 0) dup2(stdin_fd, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  setpgid(pid_, pid_);
  close(out[1]);
  close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  fcntl(out_fd_, F_SETFL, O_NONBLOCK);
  fcntl(err_fd_, F_SETFL, O_NONBLOCK);
}

Child::~Child() {
  if (!reaped_ && pid_ > 0) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

void Child::Pump(int for_ms) {
  pollfd fds[2] = {{stdout_paused_ ? -1 : out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  int n = poll(fds, 2, for_ms);
  if (n <= 0) return;
  char buf[65536];
  for (int i = 0; i < 2; ++i) {
    if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
    for (;;) {
      ssize_t r = read(fds[i].fd, buf, sizeof buf);
      if (r <= 0) break;
      (i == 0 ? out_ : err_).append(buf, r);
    }
  }
}

RunResult Child::Wait(std::chrono::milliseconds timeout) {
  RunResult r;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reaped_) {
    Pump(5);
    pid_t w = waitpid(pid_, &status_, WNOHANG);
    if (w == pid_) {
      reaped_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      kill(-pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
      reaped_ = true;
    }
  }
  // What is still in the pipes (writers that outlive the child are cut off after a moment).
  for (int i = 0; i < 20; ++i) Pump(5);
  r.out = out_;
  r.err = err_;
  r.exit_code = WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  return r;
}

std::vector<std::string> PythonTorchEnv(std::vector<std::string> more) {
  more.insert(more.begin(), "PYTHON_EXEC=/usr/bin/python3");
  const char* libuv = std::getenv("USE_LIBUV");
  if (libuv && std::string(libuv) == "0") more.push_back("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1");
  return more;
}

RunResult RunCmd(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                 std::chrono::milliseconds timeout) {
  Child c(argv, extra_env);
  return c.Wait(timeout);
}

bool WaitUntil(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

bool ProcessAlive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return false;
  std::string line;
  std::getline(f, line);
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

std::pair<pid_t, std::string> ParentAndName(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const auto open = stat.find('('), close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close + 4 > stat.size()) return {0, ""};
  std::istringstream rest(stat.substr(close + 2));
  std::string state;
  long ppid = 0;
  if (!(rest >> state >> ppid)) return {0, ""};
  return {static_cast<pid_t>(ppid), stat.substr(open + 1, close - open - 1)};
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<float> v;
  float x;
  while (f.read(reinterpret_cast<char*>(&x), sizeof x)) v.push_back(x);
  return v;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

std::vector<pid_t> ReadPids(const std::string& path) {
  std::vector<pid_t> out;
  std::ifstream f(path);
  long p;
  while (f >> p) out.push_back(static_cast<pid_t>(p));
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

TempDir::TempDir() {
  std::string tmpl = "/tmp/launch-test-XXXXXX";
  if (!mkdtemp(tmpl.data())) std::abort();
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

bool PythonHasTorch() { return RunCmd({"/usr/bin/python3", "-c", "import torch.distributed"}).exit_code == 0; }

bool PythonTorchRequired() {
  const char* v = std::getenv("LAUNCH_TEST_REQUIRE_TORCH");
  return v && std::string(v) == "1";
}

namespace {
// A decimal number of up to 18 digits, and nothing else.
bool ParseDigits(const std::string& s, long* out) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stol(s);
  return true;
}
}  // namespace

// The live train_mlp workers whose parent is one of `agents`. A standby still loading LibTorch
// has the program's name too (it is named launch-standby from its own static initialization
// on); its stdout is the agent's memfd, where a worker's is a pipe.
std::vector<pid_t> TrainWorkers(const std::vector<pid_t>& agents) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    int pid = 0;
    long number = 0;
    if (!ParseDigits(e.path().filename().string(), &number)) continue;
    pid = static_cast<int>(number);
    auto [ppid, name] = ParentAndName(pid);
    if (name != "train_mlp" || !std::count(agents.begin(), agents.end(), ppid) || !ProcessAlive(pid)) continue;
    std::error_code ec;
    const std::string stdout_target =
        std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/fd/1", ec).string();
    if (stdout_target.rfind("/memfd:launch-standby", 0) != 0) out.push_back(pid);
  }
  return out;
}

// The step of the newest checkpoint in `dir` (0: none).
long NewestCheckpoint(const std::string& dir) {
  long newest = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    long step = 0;
    if (name.rfind("ckpt-", 0) == 0 && name.size() >= 15 && ParseDigits(name.substr(5, 10), &step))
      newest = std::max(newest, step);
  }
  return newest;
}

TestCerts::TestCerts(const TempDir& dir) {
  auto run = [&](std::vector<std::string> argv) {
    auto r = RunCmd(argv);
    if (r.exit_code != 0) {
      ok = false;
      error += "exit " + std::to_string(r.exit_code) + ": " + r.err;
    }
  };
  // etcd checks its clients' certificates for clientAuth, and its own for serverAuth.
  WriteFile(dir / "server.ext", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
  WriteFile(dir / "client.ext", "extendedKeyUsage=clientAuth\n");
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
  auto req = [&](std::vector<std::string> head, std::vector<std::string> rest) {
    head.insert(head.end(), ec.begin(), ec.end());
    head.insert(head.end(), rest.begin(), rest.end());
    return head;
  };
  run(req({"/usr/bin/openssl", "req", "-x509"},
          {"-keyout", dir / "ca.key", "-out", dir / "ca.pem", "-days", "2", "-subj", "/CN=launch-test-ca"}));
  for (std::string who : {"server", "client"}) {
    run(req({"/usr/bin/openssl", "req"},
            {"-keyout", dir / (who + ".key"), "-out", dir / (who + ".csr"), "-subj", "/CN=" + who}));
    run({"/usr/bin/openssl", "x509", "-req", "-in", dir / (who + ".csr"), "-CA", dir / "ca.pem", "-CAkey",
         dir / "ca.key", "-CAcreateserial", "-out", dir / (who + ".pem"), "-days", "2", "-extfile",
         dir / (who + ".ext")});
  }
  ca = dir / "ca.pem";
  server_cert = dir / "server.pem";
  server_key = dir / "server.key";
  client_cert = dir / "client.pem";
  client_key = dir / "client.key";
}

}  // namespace launch::testing
