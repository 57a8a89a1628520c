#include "launch_sdk/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace launch_sdk {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'L', 'A', 'U', 'N', 'C', 'H', 'C', '1'};
constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".lck";
constexpr const char* kBufferPrefix = "buffer:";

struct Header {
  char magic[8];
  uint64_t payload_size;
  uint64_t checksum;
};

void WriteFully(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("checkpoint: write " + path + ": " + std::strerror(errno));
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

at::Tensor Scalar64(int64_t v) { return at::tensor({v}, at::kLong); }
at::Tensor ScalarF(double v) { return at::tensor({v}, at::kDouble); }

int64_t StepOf(const std::string& name) {
  return std::stoll(name.substr(std::strlen(kPrefix), name.size() - std::strlen(kPrefix) - std::strlen(kSuffix)));
}

}  // namespace

uint64_t Fnv1a64(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

Checkpointer::Checkpointer(std::string dir, int keep_last) : dir_(std::move(dir)), keep_last_(keep_last) {
  if (keep_last_ < 1) throw std::invalid_argument("Checkpointer: keep_last must be >= 1");
}

std::vector<std::string> Checkpointer::List() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0 || name.size() <= std::strlen(kPrefix) + std::strlen(kSuffix) ||
        name.compare(name.size() - std::strlen(kSuffix), std::string::npos, kSuffix) != 0) {
      continue;
    }
    try {
      found.emplace_back(StepOf(name), e.path().string());
    } catch (const std::exception&) {
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

void Checkpointer::Save(const TrainState& state, torch::nn::Module& model, torch::optim::Optimizer& optim,
                        int rank) {
  if (rank != 0) return;
  torch::serialize::OutputArchive archive;
  {
    torch::serialize::OutputArchive m;
    for (const auto& p : model.named_parameters()) m.write(p.key(), p.value());
    for (const auto& b : model.named_buffers()) m.write(std::string(kBufferPrefix) + b.key(), b.value(), /*is_buffer=*/true);
    archive.write("model", m);
    torch::serialize::OutputArchive o;
    optim.save(o);
    archive.write("optimizer", o);
  }
  archive.write("step", Scalar64(state.step));
  archive.write("epoch", Scalar64(state.epoch));
  archive.write("sampler_position", Scalar64(state.sampler_position));
  archive.write("loss_scale", ScalarF(state.loss_scale));
  archive.write("scaler_growth_tracker", Scalar64(state.scaler_growth_tracker));
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    archive.write("cpu_rng_state", gen.get_state());
  }
  std::ostringstream payload_stream;
  archive.save_to(payload_stream);
  const std::string payload = payload_stream.str();

  fs::create_directories(dir_);
  char name[64];
  std::snprintf(name, sizeof name, "%s%010lld%s", kPrefix, static_cast<long long>(state.step), kSuffix);
  const std::string final_path = (fs::path(dir_) / name).string();
  const std::string tmp_path = final_path + ".tmp";
  Header h;
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.payload_size = payload.size();
  h.checksum = Fnv1a64(payload.data(), payload.size());
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("checkpoint: open " + tmp_path + ": " + std::strerror(errno));
  try {
    WriteFully(fd, reinterpret_cast<const char*>(&h), sizeof h, tmp_path);
    WriteFully(fd, payload.data(), payload.size(), tmp_path);
    if (::fsync(fd) != 0) throw std::runtime_error("checkpoint: fsync " + tmp_path + ": " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp_path.c_str());
    throw;
  }
  ::close(fd);
  if (std::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    ::unlink(tmp_path.c_str());
    throw std::runtime_error("checkpoint: rename to " + final_path + ": " + std::strerror(errno));
  }
  // The rename is durable once the directory is synced.
  int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  std::vector<std::string> all = List();
  for (size_t i = 0; i + static_cast<size_t>(keep_last_) < all.size(); ++i) ::unlink(all[i].c_str());
}

std::optional<TrainState> Checkpointer::LoadLatest(torch::nn::Module& model, torch::optim::Optimizer& optim) {
  std::vector<std::string> all = List();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string& path = *it;
    std::ifstream f(path, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    Header h;
    const char* why = nullptr;
    if (data.size() < sizeof h) {
      why = "truncated header";
    } else {
      std::memcpy(&h, data.data(), sizeof h);
      if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) why = "not a launch checkpoint";
      else if (data.size() - sizeof h != h.payload_size) why = "truncated (size mismatch)";
      else if (Fnv1a64(data.data() + sizeof h, h.payload_size) != h.checksum) why = "checksum mismatch";
    }
    if (why) {
      std::fprintf(stderr, "launch_sdk: skipping checkpoint %s: %s\n", path.c_str(), why);
      continue;
    }
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(data.data() + sizeof h, h.payload_size);
      torch::serialize::InputArchive m, o;
      archive.read("model", m);
      archive.read("optimizer", o);
      // Copied into the existing tensors, never re-pointed: DistributedDataParallel's autograd
      // hooks and the optimizer keep referring to the same parameters.
      std::vector<std::pair<at::Tensor, at::Tensor>> loaded;
      for (const auto& p : model.named_parameters()) {
        at::Tensor t;
        m.read(p.key(), t);
        if (!t.sizes().equals(p.value().sizes())) {
          throw std::runtime_error("parameter " + p.key() + " has a different shape");
        }
        loaded.emplace_back(p.value(), t);
      }
      for (const auto& b : model.named_buffers()) {
        at::Tensor t;
        m.read(std::string(kBufferPrefix) + b.key(), t, /*is_buffer=*/true);
        loaded.emplace_back(b.value(), t);
      }
      optim.load(o);
      {
        at::NoGradGuard no_grad;
        for (auto& [dst, src] : loaded) dst.copy_(src);
      }
      TrainState s;
      // A fresh tensor per key: InputArchive::read set_()s a defined tensor in place.
      auto scalar = [&](const char* key) {
        at::Tensor t;
        archive.read(key, t);
        return t;
      };
      s.step = scalar("step").item<int64_t>();
      s.epoch = scalar("epoch").item<int64_t>();
      s.sampler_position = scalar("sampler_position").item<int64_t>();
      s.loss_scale = scalar("loss_scale").item<double>();
      s.scaler_growth_tracker = scalar("scaler_growth_tracker").item<int64_t>();
      at::Tensor rng = scalar("cpu_rng_state");
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(rng);
      return s;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "launch_sdk: skipping checkpoint %s: %s\n", path.c_str(), e.what());
    }
  }
  return std::nullopt;
}

}  // namespace launch_sdk
