#include "doctor/doctor_facts.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <link.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "probes/cpus.h"
#include "probes/process.h"
#include "probes/signals.h"
#include "common/unique_fd.h"
#include "google/protobuf/util/json_util.h"
#include "launch.pb.h"
#include "doctor/elf_facts.h"

namespace launch {
namespace {

#if defined(__x86_64__)
constexpr char kTriplet[] = "x86_64-linux-gnu";
#elif defined(__aarch64__)
constexpr char kTriplet[] = "aarch64-linux-gnu";
#else
constexpr char kTriplet[] = "";
#endif

// Bounds on what is read from the machine.
constexpr size_t kMaxSmallFile = 64 * 1024;        // /proc, /sys, ld.so.conf files
constexpr size_t kMaxCudaHeaderRead = 256 * 1024;  // CUDA_VERSION is near the top of cuda.h
constexpr int kMaxListedEntries = 1024;            // entries of one directory
constexpr int kMaxDirectoryDepth = 256;            // ancestors walked up from --log-dir
constexpr size_t kMaxProbeOutput = 64 * 1024;
constexpr size_t kMaxProbeErrorOutput = 4 * 1024;

// At most `max` bytes of a regular file (also /proc and /sys files); never blocks on a FIFO.
std::optional<std::string> ReadBounded(const std::string& path, size_t max) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) return std::nullopt;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  std::string out;
  char buf[8192];
  while (out.size() < max) {
    const ssize_t n = ::read(fd.get(), buf, std::min(sizeof buf, max - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : path;
}

std::vector<std::string> ListDirectory(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return names;
  while (dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (static_cast<int>(names.size()) == kMaxListedEntries) break;
    names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

std::string EnvOr(const Env& env, const char* name, const std::string& fallback = "") {
  auto it = env.find(name);
  return it == env.end() ? fallback : it->second;
}

}  // namespace

// ---- Subprocesses ----

absl::StatusOr<Captured> RunCaptured(const std::vector<std::string>& argv, const Env& env,
                                     std::chrono::milliseconds timeout, SignalFd* signals) {
  Pipe out, err;
  if (!MakePipe(&out) || !MakePipe(&err)) return absl::InternalError("pipe failed");
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  SpawnOptions spawn;
  spawn.argv = argv;
  spawn.env = EnvToStrings(env);
  spawn.stdin_fd = null.get();
  spawn.stdout_fd = out.write.get();
  spawn.stderr_fd = err.write.get();
  PosixProcessLauncher launcher;
  auto pid = launcher.Spawn(spawn);
  if (!pid.ok()) return pid.status();
  out.write.Reset();
  err.write.Reset();
  Captured c;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left_ms = [&] {
    return static_cast<int>(std::max<long long>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count()));
  };
  struct Stream {
    UniqueFd* fd;
    std::string* text;
    size_t max;
  } streams[] = {{&out.read, &c.out, kMaxProbeOutput}, {&err.read, &c.err, kMaxProbeErrorOutput}};
  while ((out.read.valid() || err.read.valid()) && left_ms() > 0 && c.stopped_by == 0) {
    pollfd p[3];
    int n = 0;
    for (auto& s : streams) {
      if (s.fd->valid()) p[n++] = {s.fd->get(), POLLIN, 0};
    }
    if (signals != nullptr) p[n++] = {signals->fd(), POLLIN, 0};
    if (::poll(p, n, left_ms()) <= 0) continue;
    for (int i = 0; i < n; ++i) {
      if (signals != nullptr && p[i].fd == signals->fd() && (p[i].revents & POLLIN)) {
        while (const int sig = signals->Read()) {
          if (sig != SIGCHLD) c.stopped_by = sig;  // SIGCHLD: this child's own, waited for below
        }
        continue;
      }
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      for (auto& s : streams) {
        if (!s.fd->valid() || s.fd->get() != p[i].fd) continue;
        char buf[4096];
        const ssize_t got = ::read(s.fd->get(), buf, sizeof buf);
        if (got > 0) {
          s.text->append(buf, std::min(static_cast<size_t>(got), s.max - std::min(s.max, s.text->size())));
        } else if (got == 0 || errno != EINTR) {
          s.fd->Reset();
        }
      }
    }
  }
  // Output still open at the deadline: the child, or something it left behind holding its
  // pipes, is stuck; its whole process group goes.
  if (out.read.valid() || err.read.valid()) {
    c.timed_out = c.stopped_by == 0;
    launcher.SignalGroup(*pid, SIGKILL);
  }
  // Output closed: give it until the deadline to exit, then kill it.
  bool reaped = false;
  while (!reaped) {
    const pid_t r = ::waitpid(*pid, &c.status, WNOHANG);
    reaped = r == *pid;
    if (reaped || r < 0 || left_ms() == 0) break;
    ::poll(nullptr, 0, std::min(left_ms(), 10));
  }
  if (!reaped) {
    c.timed_out = true;
    launcher.KillAndReap(*pid);
  }
  return c;
}

namespace {

// ---- NVML ----

void GatherNvml(DoctorFacts* f) {
  auto nvml = Nvml::Load(NvmlLibraryFromEnv());
  if (!nvml.ok()) {
    f->nvml_error = std::string(nvml.status().message());
    return;
  }
  f->nvml_loaded = true;
  f->driver = (*nvml)->System();
  f->gpus = (*nvml)->Sample();
  for (const GpuFigures& g : f->gpus) {
    GpuNumaNode n{g.index, -1};
    if (!g.pci_bus_id.empty()) {
      if (auto text = ReadBounded(absl::StrCat("/sys/bus/pci/devices/", SysfsPciAddress(g.pci_bus_id), "/numa_node"),
                                  kMaxSmallFile)) {
        int node;
        if (absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &node) && node >= 0) n.node = node;
      }
    }
    f->gpu_numa.push_back(n);
  }
}

// ---- CUDA libraries ----

using VersionFn = int (*)(int*);  // cudaRuntimeGetVersion, ncclGetVersion
using SizeFn = size_t (*)();      // cudnnGetVersion, cudnnGetCudartVersion

struct LibraryCloser {
  void operator()(void* h) const {
    if (h) ::dlclose(h);
  }
};
using LibraryHandle = std::unique_ptr<void, LibraryCloser>;

// The first candidate the dynamic loader opens; `loaded` says which, as the loader resolved it.
LibraryHandle OpenFirst(const std::vector<std::string>& candidates, LoadedLibrary* loaded) {
  std::string first_error;
  for (const std::string& name : candidates) {
    ::dlerror();
    LibraryHandle h(::dlopen(name.c_str(), RTLD_LAZY | RTLD_LOCAL));
    if (!h) {
      const char* why = ::dlerror();
      if (first_error.empty()) first_error = why ? why : name;
      continue;
    }
    loaded->found = true;
    link_map* map = nullptr;
    loaded->path = ::dlinfo(h.get(), RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name ? map->l_name : name;
    return h;
  }
  loaded->error = first_error.empty() ? "not found" : first_error;
  return nullptr;
}

template <typename F>
F Symbol(void* library, const char* name) {
  return reinterpret_cast<F>(::dlsym(library, name));
}

void GatherCuda(const Env& env, const std::vector<std::string>& libtorch_cudart, DoctorFacts* f) {
  CudaFacts& c = f->cuda;
  for (const std::string& root : {EnvOr(env, "CUDA_HOME"), EnvOr(env, "CUDA_PATH"), std::string("/usr/local/cuda")}) {
    if (!root.empty() && IsDirectory(root)) {
      c.toolkit_root = RealPath(root);
      break;
    }
  }
  if (c.toolkit_root.empty()) {
    // nvcc on PATH: <root>/bin/nvcc.
    if (auto nvcc = ResolveExecutable("nvcc", EnvOr(env, "PATH")); nvcc.ok()) {
      const std::string real = RealPath(*nvcc);
      const size_t bin = real.rfind("/bin/nvcc");
      if (bin != std::string::npos) c.toolkit_root = real.substr(0, bin);
    }
  }
  if (!c.toolkit_root.empty()) {
    if (auto header = ReadBounded(c.toolkit_root + "/include/cuda.h", kMaxCudaHeaderRead)) {
      c.toolkit_version = ParseCudaVersionDefine(*header);
    }
  }
  // The toolkit's own directories last: the loader's choice is what a program would get.
  std::vector<std::string> toolkit_dirs;
  if (!c.toolkit_root.empty()) toolkit_dirs = {c.toolkit_root + "/lib64/", c.toolkit_root + "/lib/"};
  auto with_toolkit = [&](std::vector<std::string> names, const std::string& file) {
    for (const auto& d : toolkit_dirs) names.push_back(d + file);
    return names;
  };

  std::vector<std::string> cudart = libtorch_cudart;  // what a CUDA LibTorch asks for comes first
  for (const char* n : {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}) cudart.push_back(n);
  if (auto h = OpenFirst(with_toolkit(cudart, "libcudart.so"), &c.runtime)) {
    int v = 0;
    if (auto fn = Symbol<VersionFn>(h.get(), "cudaRuntimeGetVersion"); fn && fn(&v) == 0 && v > 0)
      c.runtime.version = v;
  }
  if (auto h = OpenFirst(with_toolkit({"libnccl.so.2", "libnccl.so"}, "libnccl.so.2"), &c.nccl)) {
    int v = 0;
    if (auto fn = Symbol<VersionFn>(h.get(), "ncclGetVersion"); fn && fn(&v) == 0 && v > 0) c.nccl.version = v;
  }
  if (auto h = OpenFirst(with_toolkit({"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"}, "libcudnn.so"), &c.cudnn)) {
    if (auto fn = Symbol<SizeFn>(h.get(), "cudnnGetVersion"))
      c.cudnn.version = static_cast<int>(std::min<size_t>(fn(), INT_MAX));
    if (auto fn = Symbol<SizeFn>(h.get(), "cudnnGetCudartVersion")) {
      c.cudnn_cuda_version = static_cast<int>(std::min<size_t>(fn(), INT_MAX));
    }
  }
}

// ---- LibTorch ----

std::string FindIn(const std::vector<std::string>& dirs, const std::string& name) {
  for (const auto& d : dirs) {
    const std::string p = absl::StrCat(d, "/", name);
    if (IsRegularFile(p)) return p;
  }
  return "";
}

bool IsBlasName(const std::string& soname) {
  for (const char* prefix :
       {"libblas.so", "libopenblas", "libmkl_", "libblis", "libcblas", "libatlas", "libflexiblas"}) {
    if (absl::StartsWith(soname, prefix)) return true;
  }
  return false;
}

// The CUDA libraries a CUDA LibTorch needs by name (the rest are torch's own or the system's).
bool IsCudaDependency(const std::string& soname) {
  for (const char* prefix : {"libcudart", "libnccl", "libcudnn", "libcublas", "libcufft", "libcurand", "libcusparse",
                             "libcusolver", "libnvrtc", "libnvToolsExt", "libnvJitLink", "libcupti"}) {
    if (absl::StartsWith(soname, prefix)) return true;
  }
  return false;
}

// Returns the libcudart names a CUDA LibTorch needs (for the runtime probe to load the same one).
std::vector<std::string> GatherLibTorch(const std::vector<std::string>& search, TorchFacts* t) {
  std::vector<std::string> cudart;
  const std::string libtorch = FindIn(search, "libtorch.so");
  if (libtorch.empty()) {
    t->missing =
        "no libtorch.so where the dynamic loader looks (LD_LIBRARY_PATH, ld.so.conf, system "
        "directories)";
    return cudart;
  }
  t->found = true;
  // Through links (a merged /usr makes /lib the same as /usr/lib): the directory as it really is.
  const std::string dir = RealPath(libtorch.substr(0, libtorch.rfind('/')));
  t->where = dir;
  const std::string real = RealPath(libtorch);
  t->version = SonameVersion(real.substr(real.rfind('/') + 1));
  // PyTorch's own libtorch archives say what they are: "2.6.0+cu126".
  if (auto build = ReadBounded(dir + "/../build-version", 256)) {
    const std::string v(absl::StripAsciiWhitespace(*build));
    if (!v.empty()) t->version = v;
    const size_t cu = v.find("+cu");
    if (cu != std::string::npos && v.size() >= cu + 5) {
      const std::string digits = v.substr(cu + 3);  // "126" -> 12.6, "118" -> 11.8
      t->cuda_version = absl::StrCat(digits.substr(0, digits.size() - 1), ".", digits.substr(digits.size() - 1));
    }
  }
  std::vector<std::string> lib_dirs = {dir};
  lib_dirs.insert(lib_dirs.end(), search.begin(), search.end());

  // BLAS: what libtorch_cpu (libtorch before 1.8) links.
  std::string cpu = FindIn({dir}, "libtorch_cpu.so");
  if (cpu.empty()) cpu = libtorch;
  if (auto elf = ReadElfFacts(cpu); elf.ok()) {
    t->blas_bundled = true;
    for (const std::string& n : elf->needed) {
      if (!IsBlasName(n)) continue;
      t->blas_bundled = false;
      t->blas_info = n;
      const std::string path = FindIn(lib_dirs, n);
      t->blas_library = path.empty() ? "" : RealPath(path);
      if (t->blas_library.empty()) t->unresolved.push_back(n);
      break;
    }
  } else {
    t->error = std::string(elf.status().message());
  }

  // CUDA: libtorch_cuda (split in two from 1.10 to 1.12) carries the kernels and names the CUDA
  // libraries it needs.
  std::set<std::string> archs;
  bool any_cuda = false;
  for (const char* name : {"libtorch_cuda.so", "libtorch_cuda_cu.so", "libtorch_cuda_cpp.so"}) {
    const std::string path = FindIn({dir}, name);
    if (path.empty()) continue;
    any_cuda = true;
    auto elf = ReadElfFacts(path);
    if (!elf.ok()) {
      t->error = std::string(elf.status().message());
      continue;
    }
    for (const std::string& n : elf->needed) {
      if (absl::StartsWith(n, "libcudart.so")) {
        cudart.push_back(n);
        if (t->cuda_version.empty()) t->cuda_version = SonameVersion(n);
      }
      if (IsCudaDependency(n) && FindIn(lib_dirs, n).empty() &&
          std::find(t->unresolved.begin(), t->unresolved.end(), n) == t->unresolved.end()) {
        t->unresolved.push_back(n);
      }
    }
    for (const auto& a : elf->gpu_archs) {
      if (archs.insert(a).second) t->arch_list.push_back(a);
    }
  }
  t->cuda = any_cuda;
  return cudart;
}

// ---- Python ----

// Prints one JSON line: what `launch doctor` needs of the interpreter's torch. The arch list
// comes from the build flags (torch.cuda.get_arch_list() answers [] where no driver is loaded).
constexpr char kPythonProbe[] = R"PY(
import json, os, re, sys
out = {"python": sys.executable}
try:
    import torch
except Exception as e:
    out["missing"] = "%s: %s" % (type(e).__name__, e)
else:
    out["version"] = str(torch.__version__)
    out["cuda"] = torch.version.cuda or ""
    archs = []
    try:
        archs = torch._C._cuda_getArchFlags().split()
    except Exception:
        try:
            archs = list(torch.cuda.get_arch_list())
        except Exception:
            pass
    out["arch_list"] = [str(a) for a in archs]
    try:
        out["cudnn_version"] = int(torch.backends.cudnn.version() or 0)
    except Exception:
        pass
    try:
        v = torch.cuda.nccl.version()
        out["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        pass
    try:
        m = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
        out["blas_info"] = m.group(1) if m else ""
    except Exception:
        pass
    libs = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                name = os.path.basename(path)
                if path.startswith("/") and re.match(r"lib(open)?blas|libmkl_|libblis|libatlas|libflexiblas", name) and path not in libs:
                    libs.append(path)
    except Exception:
        pass
    out["blas_libraries"] = libs
print(json.dumps(out))
)PY";

void GatherPython(const DoctorRequest& request, const Env& env, SignalFd* signals, int* stopped_by, TorchFacts* t) {
  // As launch runs .py workers: PYTHON_EXEC (unless empty), else python3 on PATH.
  std::string name = request.python.empty() ? EnvOr(env, "PYTHON_EXEC") : request.python;
  if (name.empty()) name = "python3";
  auto python = ResolveExecutable(name, EnvOr(env, "PATH", "/usr/local/bin:/usr/bin:/bin"));
  if (!python.ok()) {
    t->missing = std::string(python.status().message());
    return;
  }
  t->where = *python;
  auto run = RunCaptured({*python, "-c", kPythonProbe}, env, request.python_timeout, signals);
  if (!run.ok()) {
    t->error = absl::StrCat("cannot run ", *python, ": ", run.status().message());
    return;
  }
  const std::string out(absl::StripAsciiWhitespace(run->out));
  const size_t last_newline = out.rfind('\n');
  const absl::Status parsed = ParsePythonProbe(out.substr(last_newline == std::string::npos ? 0 : last_newline + 1), t);
  if (parsed.ok()) return;
  if (run->stopped_by != 0) {
    *stopped_by = run->stopped_by;
    t->error = absl::StrCat("stopped by ", SignalName(run->stopped_by), " while asking ", *python);
    return;
  }
  if (run->timed_out) {
    t->error = absl::StrCat(*python, " did not answer within ",
                            absl::FormatDuration(absl::FromChrono(request.python_timeout)));
    return;
  }
  if (WIFSIGNALED(run->status)) {
    t->error = absl::StrCat(*python, " was killed by ", SignalName(WTERMSIG(run->status)));
    return;
  }
  // Its last line on stderr says why (a traceback's last line is the exception).
  std::string err(absl::StripAsciiWhitespace(run->err));
  if (err.rfind('\n') != std::string::npos) err = err.substr(err.rfind('\n') + 1);
  t->error = absl::StrCat(*python, ": ", err.empty() ? std::string(parsed.message()) : err);
}

// ---- Host ----

void GatherHost(DoctorFacts* f) {
  struct statvfs vfs;
  if (::statvfs("/dev/shm", &vfs) == 0 && IsDirectory("/dev/shm")) {
    f->shm_found = true;
    f->shm_total_bytes = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
    f->shm_free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  }
  f->usable_cpus = UsableCpuCount();
  f->affinity_cpus = AffinityCpuCount();
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) f->affinity.push_back(cpu);
    }
  }
  for (const std::string& entry : ListDirectory("/sys/devices/system/node")) {
    int id;
    if (!absl::StartsWith(entry, "node") || !absl::SimpleAtoi(entry.substr(4), &id)) continue;
    const std::string dir = "/sys/devices/system/node/" + entry;
    NumaNode node{id, {}, 0};
    if (auto text = ReadBounded(dir + "/cpulist", kMaxSmallFile)) {
      if (auto cpus = ParseCpuList(std::string(absl::StripAsciiWhitespace(*text)))) node.cpus = *cpus;
    }
    if (auto text = ReadBounded(dir + "/meminfo", kMaxSmallFile)) {
      for (absl::string_view line : absl::StrSplit(*text, '\n')) {
        const size_t at = line.find("MemTotal:");
        if (at == absl::string_view::npos) continue;
        std::vector<absl::string_view> words = absl::StrSplit(line.substr(at + 9), ' ', absl::SkipEmpty());
        uint64_t kib;
        if (!words.empty() && absl::SimpleAtoi(words[0], &kib) && kib < (UINT64_MAX >> 10))
          node.memory_bytes = kib << 10;
      }
    }
    f->numa.push_back(std::move(node));
  }
  std::sort(f->numa.begin(), f->numa.end(), [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });

  rlimit lim{};
  auto finite = [](rlim_t v) { return v == RLIM_INFINITY ? std::nullopt : std::optional<uint64_t>(v); };
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    f->open_files_soft = finite(lim.rlim_cur);
    f->open_files_hard = finite(lim.rlim_max);
  }
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0) f->memlock_soft = finite(lim.rlim_cur);
  f->rdma_devices = ListDirectory("/sys/class/infiniband");
}

DirectoryFacts GatherDirectory(const std::string& flag, const std::string& path) {
  DirectoryFacts d;
  d.flag = flag;
  d.path = path;
  if (path.empty()) return d;
  // launch creates what is missing: what matters is the nearest part that exists.
  std::filesystem::path at = std::filesystem::absolute(path);
  std::error_code ec;
  for (int depth = 0; depth < kMaxDirectoryDepth && !std::filesystem::exists(at, ec); ++depth) {
    at = at.parent_path();
  }
  struct stat st;
  if (::stat(at.c_str(), &st) != 0) {
    d.error = "no part of it exists";
    return d;
  }
  if (!S_ISDIR(st.st_mode)) {
    d.error = absl::StrCat(at.string(), " exists and is not a directory");
    return d;
  }
  d.existing = at.string();
  struct statfs fs;
  if (::statfs(d.existing.c_str(), &fs) == 0) {
    d.fs_type = FilesystemTypeName(static_cast<int64_t>(fs.f_type));
    d.free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_bsize;
  }
  d.writable = ::access(d.existing.c_str(), W_OK | X_OK) == 0;
  return d;
}

std::vector<std::string> LoaderSearchPath(const Env& env) {
  std::vector<std::string> confs;
  if (auto text = ReadBounded("/etc/ld.so.conf", kMaxSmallFile)) confs.push_back(*text);
  glob_t g{};
  if (::glob("/etc/ld.so.conf.d/*.conf", 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc && i < static_cast<size_t>(kMaxListedEntries); ++i) {
      if (auto text = ReadBounded(g.gl_pathv[i], kMaxSmallFile)) confs.push_back(*text);
    }
  }
  ::globfree(&g);
  return LibrarySearchPath(EnvOr(env, "LD_LIBRARY_PATH"), confs, kTriplet);
}

}  // namespace

// ---- Pure pieces ----

std::string PickBlas(const std::vector<std::string>& paths) {
  std::string fallback;
  for (const std::string& path : paths) {
    const std::string name = path.substr(path.rfind('/') + 1);
    // CBLAS and LAPACK wrappers sit on a BLAS: the BLAS itself is what computes.
    if (absl::StartsWith(name, "libcblas") || absl::StartsWith(name, "liblapack")) continue;
    if (absl::StartsWith(name, "libblas")) {
      if (fallback.empty()) fallback = path;
      continue;
    }
    return path;  // OpenBLAS, MKL, BLIS, ATLAS, FlexiBLAS by name
  }
  return fallback;
}

int ParseCudaVersionDefine(const std::string& cuda_h) {
  for (absl::string_view line : absl::StrSplit(cuda_h, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "#define")) continue;
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "CUDA_VERSION")) continue;
    if (line.empty() || !absl::ascii_isspace(static_cast<unsigned char>(line[0]))) continue;
    int v;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &v) && v > 0) return v;
  }
  return 0;
}

std::vector<std::string> LibrarySearchPath(const std::string& ld_library_path,
                                           const std::vector<std::string>& ld_so_conf_texts,
                                           const std::string& triplet) {
  std::vector<std::string> dirs;
  std::set<std::string> seen;
  auto add = [&](absl::string_view d) {
    std::string dir(absl::StripAsciiWhitespace(d));
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    if (dir.empty() || dir[0] != '/' || !seen.insert(dir).second) return;
    dirs.push_back(dir);
  };
  for (absl::string_view d : absl::StrSplit(ld_library_path, absl::ByAnyChar(":;"), absl::SkipEmpty())) add(d);
  for (const std::string& text : ld_so_conf_texts) {
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      line = line.substr(0, line.find('#'));
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || absl::StartsWith(line, "include")) continue;
      add(line);
    }
  }
  if (!triplet.empty()) {
    add(absl::StrCat("/lib/", triplet));
    add(absl::StrCat("/usr/lib/", triplet));
  }
  for (const char* d : {"/lib64", "/usr/lib64", "/lib", "/usr/lib"}) add(d);
  return dirs;
}

std::string FilesystemTypeName(int64_t f_type) {
  static const std::map<uint32_t, const char*> kNames = {
      {0xEF53, "ext4"},         {0x58465342, "xfs"},  {0x9123683E, "btrfs"},  {0x01021994, "tmpfs"},
      {0x858458F6, "ramfs"},    {0x6969, "nfs"},      {0xFF534D42, "cifs"},   {0xFE534D42, "smb2"},
      {0x794C7630, "overlay"},  {0x65735546, "fuse"}, {0x0BD00BD0, "lustre"}, {0x47504653, "gpfs"},
      {0x2FC12FC1, "zfs"},      {0x00C36400, "ceph"}, {0x19830326, "beegfs"}, {0x01021997, "9p"},
      {0x73717368, "squashfs"}, {0x5346544E, "ntfs"}, {0x4D44, "vfat"},       {0x6E736673, "nsfs"}};
  const uint32_t type = static_cast<uint32_t>(f_type);
  auto it = kNames.find(type);
  if (it != kNames.end()) return it->second;
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%x", type);
  return hex;
}

absl::Status ParsePythonProbe(const std::string& json, TorchFacts* t) {
  v1::PythonTorchProbe probe;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (json.size() > kMaxProbeOutput || json.empty() || json[0] != '{' ||
      !google::protobuf::util::JsonStringToMessage(json, &probe, options).ok()) {
    return absl::InvalidArgumentError("the torch probe printed no JSON");
  }
  auto cut = [](const std::string& s, size_t n = 256) { return s.substr(0, n); };
  if (!probe.missing().empty()) {
    t->missing = cut(probe.missing());
    return absl::OkStatus();
  }
  if (probe.version().empty()) return absl::InvalidArgumentError("the torch probe named no torch version");
  t->found = true;
  t->version = cut(probe.version(), 64);
  t->cuda_version = cut(probe.cuda(), 32);
  t->cuda = !t->cuda_version.empty();
  for (const std::string& a : probe.arch_list()) {
    if (static_cast<int>(t->arch_list.size()) == kMaxProbeArchs) break;
    t->arch_list.push_back(cut(a, 64));
  }
  t->cudnn_version = probe.cudnn_version() > 0 && probe.cudnn_version() < INT_MAX
                         ? static_cast<int>(probe.cudnn_version())
                         : 0;
  t->nccl_version = cut(probe.nccl_version(), 32);
  t->blas_info = cut(probe.blas_info(), 64);
  std::vector<std::string> libraries;
  for (const std::string& lib : probe.blas_libraries()) {
    if (libraries.size() == static_cast<size_t>(kMaxProbeArchs)) break;
    libraries.push_back(cut(lib, 4096));
  }
  t->blas_library = PickBlas(libraries);
  t->blas_bundled = t->blas_library.empty() && absl::AsciiStrToLower(t->blas_info) == "mkl";
  return absl::OkStatus();
}

std::string SonameVersion(const std::string& file_name) {
  const size_t so = file_name.find(".so.");
  if (so == std::string::npos) return "";
  const std::string v = file_name.substr(so + 4);
  for (char ch : v) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(ch)) && ch != '.') return "";
  }
  return v;
}

DoctorFacts SystemDoctorProbe::Gather(const DoctorRequest& request) {
  DoctorFacts f;
  f.request = request;
  f.env = CurrentEnv();
  if (auto it = f.env.find("CUDA_VISIBLE_DEVICES"); it != f.env.end()) {
    f.cuda_visible_devices_set = true;
    f.inherited_cuda_visible_devices = it->second;
  }
  GatherNvml(&f);
  const std::vector<std::string> search = LoaderSearchPath(f.env);
  std::vector<std::string> cudart;
  if (request.check_libtorch) cudart = GatherLibTorch(search, &f.libtorch);
  GatherCuda(f.env, cudart, &f);
  if (request.check_python) GatherPython(request, f.env, signals_, &stopped_by_, &f.python_torch);
  if (kTriplet[0] != '\0') {
    const std::string openblas = absl::StrCat("/usr/lib/", kTriplet, "/openblas-pthread/libblas.so.3");
    if (IsRegularFile(openblas)) f.openblas_blas_library = openblas;
    f.blas_alternative = absl::StrCat("libblas.so.3-", kTriplet);
  }
  GatherHost(&f);
  f.log_dir = GatherDirectory("--log-dir", request.log_dir);
  f.checkpoint_dir = GatherDirectory("--checkpoint-dir", request.checkpoint_dir);
  return f;
}

}  // namespace launch
