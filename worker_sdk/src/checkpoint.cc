#include "launch_sdk/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "launch_sdk/context.h"
#include "launch_sdk/contract.h"
#include "launch_sdk/memory.h"
#include "premap.h"

namespace launch_sdk {
namespace fs = std::filesystem;

namespace {

// Files: a header, then the payload. LAUNCHC1: a torch archive (read only: written by earlier
// releases); LAUNCHC2: a snapshot (below), checksummed with Checksum64.
constexpr char kMagicArchive[8] = {'L', 'A', 'U', 'N', 'C', 'H', 'C', '1'};
constexpr char kMagicSnapshot[8] = {'L', 'A', 'U', 'N', 'C', 'H', 'C', '2'};
constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".lck";
constexpr const char* kBufferPrefix = "buffer:";

struct FileHeader {
  char magic[8];
  uint64_t payload_size;
  uint64_t checksum;
};

// A snapshot's payload: "LCK2META", the metadata's size (u64), the metadata, then, from the next
// multiple of 64, the tensors' bytes. The metadata: the TrainState, each parameter group's lr, the
// optimizer's kind, then per tensor its name, dtype, shape and place, and per named integer (an
// optimizer's step counts) its value.
constexpr char kMetaMagic[8] = {'L', 'C', 'K', '2', 'M', 'E', 'T', 'A'};
constexpr size_t kAlign = 64;
constexpr uint32_t kMaxDims = 16;
constexpr uint32_t kMaxName = 4096;

// The optimizers whose state is snapshotted tensor by tensor; any other is saved as a torch
// archive inside the snapshot (its serialization is then part of the stall).
enum class OptimKind : uint32_t {
  kNone = 0,
  kArchive = 1,
  kSgd = 2,
  kAdam = 3,
  kAdamW = 4,
  kAdagrad = 5,
  kRmsprop = 6
};

// A memory slot (a file of the agent's): this header, then the payload from kSlotPayload.
struct SlotHeader {
  char magic[8];   // "LAUNCHM1"
  uint64_t state;  // kEmpty, kWriting, kComplete
  int64_t step;
  uint64_t payload_size;
  uint64_t checksum;
};
constexpr char kSlotMagic[8] = {'L', 'A', 'U', 'N', 'C', 'H', 'M', '1'};
constexpr uint64_t kEmpty = 0, kWriting = 1, kComplete = 2;
constexpr size_t kSlotPayload = 4096;
constexpr size_t kGrowStep = size_t{2} << 20;

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

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

int64_t StepOf(const std::string& name) {
  return std::stoll(name.substr(std::strlen(kPrefix), name.size() - std::strlen(kPrefix) - std::strlen(kSuffix)));
}

std::string FileName(int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%010lld%s", kPrefix, static_cast<long long>(step), kSuffix);
  return name;
}

// --- the metadata's encoding ---

class MetaWriter {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable<T>::value, "plain values only");
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

// Every read is bounded by the metadata's size: a corrupt snapshot throws, never reads past it.
class MetaReader {
 public:
  MetaReader(const char* p, size_t n) : p_(p), n_(n) {}
  template <typename T>
  T Get() {
    T v;
    Need(sizeof v);
    std::memcpy(&v, p_ + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string GetString() {
    const uint32_t len = Get<uint32_t>();
    if (len > kMaxName) throw std::runtime_error("a name longer than " + std::to_string(kMaxName) + " bytes");
    Need(len);
    std::string s(p_ + at_, len);
    at_ += len;
    return s;
  }
  size_t left() const { return n_ - at_; }

 private:
  void Need(size_t k) const {
    if (k > n_ - at_) throw std::runtime_error("metadata ends early");
  }
  const char* p_;
  size_t n_;
  size_t at_ = 0;
};

// --- the optimizer's state, tensor by tensor ---

// The state map's key for a parameter: a string of its TensorImpl's address in LibTorch 1.x, the
// address itself in 2.x.
template <typename Key>
Key StateKey(const at::Tensor& p) {
  if constexpr (std::is_same<Key, std::string>::value) {
    std::ostringstream key;  // as c10::guts::to_string (1.x) prints the address
    key << static_cast<const void*>(p.unsafeGetTensorImpl());
    return key.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

using StateMap = std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKeyType = typename StateMap::key_type;

std::vector<at::Tensor> FlatParams(torch::optim::Optimizer& optim) {
  std::vector<at::Tensor> out;
  for (auto& g : optim.param_groups())
    for (auto& p : g.params()) out.push_back(p);
  return out;
}

OptimKind KindOf(torch::optim::Optimizer& optim) {
  if (dynamic_cast<torch::optim::SGD*>(&optim)) return OptimKind::kSgd;
  if (dynamic_cast<torch::optim::AdamW*>(&optim)) return OptimKind::kAdamW;
  if (dynamic_cast<torch::optim::Adam*>(&optim)) return OptimKind::kAdam;
  if (dynamic_cast<torch::optim::Adagrad*>(&optim)) return OptimKind::kAdagrad;
  if (dynamic_cast<torch::optim::RMSprop*>(&optim)) return OptimKind::kRmsprop;
  return OptimKind::kArchive;
}

struct Named {
  std::string name;
  at::Tensor tensor;
};

// Adam's and AdamW's states have the same members.
template <typename AdamState>
bool AdamParts(torch::optim::OptimizerParamState& st, const std::function<void(const char*, const at::Tensor&)>& add,
               const std::string& prefix, std::vector<std::pair<std::string, int64_t>>* ints) {
  auto* s = dynamic_cast<AdamState*>(&st);
  if (!s) return false;
  add("exp_avg", s->exp_avg());
  add("exp_avg_sq", s->exp_avg_sq());
  add("max_exp_avg_sq", s->max_exp_avg_sq());
  ints->emplace_back(prefix + "step", s->step());
  return true;
}

template <typename AdamState, typename Get>
std::unique_ptr<torch::optim::OptimizerParamState> MakeAdamState(const Get& get, int64_t step) {
  auto s = std::make_unique<AdamState>();
  s->exp_avg(get("exp_avg"));
  s->exp_avg_sq(get("exp_avg_sq"));
  s->max_exp_avg_sq(get("max_exp_avg_sq"));
  s->step(step);
  return s;
}

// The tensors and counters of one parameter's optimizer state, or false for a type not known here.
bool StateParts(OptimKind kind, torch::optim::OptimizerParamState& st, const std::string& prefix,
                std::vector<Named>* tensors, std::vector<std::pair<std::string, int64_t>>* ints) {
  const std::function<void(const char*, const at::Tensor&)> add = [&](const char* field, const at::Tensor& t) {
    if (t.defined()) tensors->push_back({prefix + field, t});
  };
  switch (kind) {
    case OptimKind::kSgd:
      if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(&st)) {
        add("momentum_buffer", s->momentum_buffer());
        return true;
      }
      return false;
    case OptimKind::kAdam:
      return AdamParts<torch::optim::AdamParamState>(st, add, prefix, ints);
    case OptimKind::kAdamW:
      return AdamParts<torch::optim::AdamWParamState>(st, add, prefix, ints);
    case OptimKind::kAdagrad:
      if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(&st)) {
        add("sum", s->sum());
        ints->emplace_back(prefix + "step", s->step());
        return true;
      }
      return false;
    case OptimKind::kRmsprop:
      if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(&st)) {
        add("square_avg", s->square_avg());
        add("momentum_buffer", s->momentum_buffer());
        add("grad_avg", s->grad_avg());
        ints->emplace_back(prefix + "step", s->step());
        return true;
      }
      return false;
    default:
      return false;
  }
}

// A parameter's optimizer state made from a snapshot: `get(field)` is the saved tensor (undefined
// if none), `step` the saved count.
template <typename Get>
std::unique_ptr<torch::optim::OptimizerParamState> MakeState(OptimKind kind, const Get& get, int64_t step) {
  switch (kind) {
    case OptimKind::kSgd: {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(get("momentum_buffer"));
      return s;
    }
    case OptimKind::kAdam:
      return MakeAdamState<torch::optim::AdamParamState>(get, step);
    case OptimKind::kAdamW:
      return MakeAdamState<torch::optim::AdamWParamState>(get, step);
    case OptimKind::kAdagrad: {
      auto s = std::make_unique<torch::optim::AdagradParamState>();
      s->sum(get("sum"));
      s->step(step);
      return s;
    }
    case OptimKind::kRmsprop: {
      auto s = std::make_unique<torch::optim::RMSpropParamState>();
      s->square_avg(get("square_avg"));
      s->momentum_buffer(get("momentum_buffer"));
      s->grad_avg(get("grad_avg"));
      s->step(step);
      return s;
    }
    default:
      throw std::runtime_error("unknown optimizer kind");
  }
}

// --- snapshots ---

struct Layout {
  std::string meta;  // kMetaMagic, its size, the metadata
  size_t data_offset = 0;
  size_t total = 0;
  std::vector<std::pair<at::Tensor, size_t>> copies;  // source, offset in the payload
  std::string archive;                                // OptimKind::kArchive: the optimizer's torch archive
};

Layout Plan(const TrainState& state, torch::nn::Module& model, torch::optim::Optimizer& optim) {
  std::vector<Named> tensors;
  std::vector<std::pair<std::string, int64_t>> ints;
  for (const auto& p : model.named_parameters()) tensors.push_back({"param/" + p.key(), p.value()});
  for (const auto& b : model.named_buffers()) tensors.push_back({"buffer/" + b.key(), b.value()});
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    tensors.push_back({"rng/cpu", gen.get_state()});
  }
  OptimKind kind = KindOf(optim);
  Layout l;
  if (kind != OptimKind::kArchive) {
    const std::vector<at::Tensor> params = FlatParams(optim);
    auto& map = optim.state();
    for (size_t i = 0; i < params.size() && kind != OptimKind::kArchive; ++i) {
      auto it = map.find(StateKey<StateKeyType>(params[i]));
      if (it == map.end() || !it->second) continue;
      if (!StateParts(kind, *it->second, "optim/" + std::to_string(i) + "/", &tensors, &ints))
        kind = OptimKind::kArchive;
    }
    if (kind == OptimKind::kArchive) {  // a state of another type: the archive holds it all
      tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                   [](const Named& n) { return n.name.rfind("optim/", 0) == 0; }),
                    tensors.end());
      ints.clear();
    }
  }
  if (kind == OptimKind::kArchive) {
    torch::serialize::OutputArchive o;
    optim.save(o);
    std::ostringstream s;
    o.save_to(s);
    l.archive = s.str();
  }

  MetaWriter w;
  w.Put(state.step);
  w.Put(state.epoch);
  w.Put(state.sampler_position);
  w.Put(state.loss_scale);
  w.Put(state.scaler_growth_tracker);
  w.Put<uint32_t>(static_cast<uint32_t>(optim.param_groups().size()));
  for (auto& g : optim.param_groups()) w.Put<double>(g.options().get_lr());
  w.Put<uint32_t>(static_cast<uint32_t>(kind));
  w.Put<uint64_t>(l.archive.size());
  size_t offset = AlignUp(l.archive.size(), kAlign);  // the archive's bytes come first
  w.Put<uint32_t>(static_cast<uint32_t>(tensors.size()));
  for (const Named& n : tensors) {
    const at::Tensor& t = n.tensor;
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    w.PutString(n.name);
    w.Put<int32_t>(static_cast<int32_t>(t.scalar_type()));
    w.Put<uint32_t>(static_cast<uint32_t>(t.element_size()));
    w.Put<uint32_t>(static_cast<uint32_t>(t.dim()));
    for (int64_t d : t.sizes()) w.Put<int64_t>(d);
    w.Put<uint64_t>(offset);
    w.Put<uint64_t>(bytes);
    l.copies.emplace_back(t, offset);
    offset = AlignUp(offset + bytes, kAlign);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(ints.size()));
  for (const auto& [name, v] : ints) {
    w.PutString(name);
    w.Put<int64_t>(v);
  }
  std::string meta(kMetaMagic, sizeof kMetaMagic);
  const uint64_t meta_size = w.out().size();
  meta.append(reinterpret_cast<const char*>(&meta_size), sizeof meta_size);
  meta += w.out();
  l.meta = std::move(meta);
  l.data_offset = AlignUp(l.meta.size(), kAlign);
  l.total = l.data_offset + offset;
  return l;
}

// Writes the planned snapshot into `payload` (l.total bytes): the stall of an in-memory save.
void Fill(const Layout& l, char* payload) {
  std::memcpy(payload, l.meta.data(), l.meta.size());
  char* data = payload + l.data_offset;
  if (!l.archive.empty()) std::memcpy(data, l.archive.data(), l.archive.size());
  at::NoGradGuard no_grad;
  for (const auto& [src, offset] : l.copies) {
    if (src.numel() == 0) continue;
    at::Tensor dst = at::from_blob(data + offset, src.sizes(), at::TensorOptions().dtype(src.scalar_type()));
    dst.copy_(src);  // from any device, any layout
  }
}

struct SavedTensor {
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
  const char* data;
  size_t bytes;
};

// A snapshot's contents as read from its payload, every offset and size checked against it; the
// tensors' bytes stay where they are.
struct Snapshot {
  TrainState state;
  std::vector<double> lrs;  // per parameter group
  OptimKind kind = OptimKind::kNone;
  const char* data = nullptr;  // the tensors' (and the archive's) bytes
  uint64_t archive_size = 0;   // OptimKind::kArchive: the archive's bytes, first in `data`
  std::map<std::string, SavedTensor> tensors;
  std::map<std::string, int64_t> ints;
};

TrainState ReadTrainState(MetaReader& r) {
  TrainState s;
  s.step = r.Get<int64_t>();
  s.epoch = r.Get<int64_t>();
  s.sampler_position = r.Get<int64_t>();
  s.loss_scale = r.Get<double>();
  s.scaler_growth_tracker = r.Get<int64_t>();
  return s;
}

// One tensor's entry in the metadata: its name, and where its bytes lie in `data` (data_size bytes).
std::pair<std::string, SavedTensor> ReadSavedTensor(MetaReader& r, const char* data, size_t data_size) {
  std::string name = r.GetString();
  SavedTensor t;
  const int32_t dtype = r.Get<int32_t>();
  const uint32_t elem = r.Get<uint32_t>();
  const uint32_t dims = r.Get<uint32_t>();
  if (dtype < 0 || dtype >= static_cast<int32_t>(at::ScalarType::NumOptions) || dims > kMaxDims)
    throw std::runtime_error("tensor " + name + ": bad dtype or rank");
  t.dtype = static_cast<at::ScalarType>(dtype);
  if (c10::elementSize(t.dtype) != elem) throw std::runtime_error("tensor " + name + ": element size differs");
  uint64_t numel = 1;
  for (uint32_t d = 0; d < dims; ++d) {
    const int64_t v = r.Get<int64_t>();
    if (v < 0 || (v > 0 && numel > data_size / static_cast<uint64_t>(v)))
      throw std::runtime_error("tensor " + name + ": bad shape");
    numel *= static_cast<uint64_t>(v);
    t.sizes.push_back(v);
  }
  const uint64_t offset = r.Get<uint64_t>();
  const uint64_t bytes = r.Get<uint64_t>();
  if (bytes != numel * elem || offset > data_size || bytes > data_size - offset)
    throw std::runtime_error("tensor " + name + ": outside the snapshot");
  t.data = data + offset;
  t.bytes = bytes;
  return {std::move(name), std::move(t)};
}

// Reads a snapshot's metadata. Everything is checked against the payload's size before it is used.
Snapshot ParseSnapshot(const char* payload, size_t size) {
  if (size < sizeof kMetaMagic + 8 || std::memcmp(payload, kMetaMagic, sizeof kMetaMagic) != 0)
    throw std::runtime_error("not a snapshot");
  uint64_t meta_size = 0;
  std::memcpy(&meta_size, payload + sizeof kMetaMagic, sizeof meta_size);
  const size_t head = sizeof kMetaMagic + sizeof meta_size;
  if (meta_size > size - head) throw std::runtime_error("metadata larger than the snapshot");
  const size_t data_offset = AlignUp(head + meta_size, kAlign);
  if (data_offset > size) throw std::runtime_error("metadata larger than the snapshot");
  Snapshot snap;
  snap.data = payload + data_offset;
  const size_t data_size = size - data_offset;
  MetaReader r(payload + head, meta_size);
  snap.state = ReadTrainState(r);
  const uint32_t groups = r.Get<uint32_t>();
  if (groups > r.left() / sizeof(double)) throw std::runtime_error("too many parameter groups");
  snap.lrs.resize(groups);
  for (double& lr : snap.lrs) lr = r.Get<double>();
  snap.kind = static_cast<OptimKind>(r.Get<uint32_t>());
  snap.archive_size = r.Get<uint64_t>();
  if (snap.archive_size > data_size) throw std::runtime_error("optimizer archive larger than the snapshot");
  const uint32_t count = r.Get<uint32_t>();
  if (count > r.left()) throw std::runtime_error("more tensors than the metadata can hold");
  for (uint32_t i = 0; i < count; ++i) {
    auto [name, t] = ReadSavedTensor(r, snap.data, data_size);
    snap.tensors[name] = std::move(t);
  }
  const uint32_t nints = r.Get<uint32_t>();
  if (nints > r.left()) throw std::runtime_error("more counters than the metadata can hold");
  for (uint32_t i = 0; i < nints; ++i) {
    std::string name = r.GetString();
    snap.ints[name] = r.Get<int64_t>();
  }
  return snap;
}

// A tensor of its own (the snapshot's memory is reused by the next save); undefined if not saved.
at::Tensor OwnCopy(const Snapshot& snap, const std::string& name) {
  auto it = snap.tensors.find(name);
  if (it == snap.tensors.end()) return {};
  const SavedTensor& t = it->second;
  at::Tensor out = at::empty(t.sizes, at::TensorOptions().dtype(t.dtype));
  if (t.bytes) std::memcpy(out.data_ptr(), t.data, t.bytes);
  return out;
}

// Every parameter and buffer of `model` with a view of its saved bytes; throws for one not saved
// or saved with another shape or dtype. (Copied in once everything is checked: a fresh copy of
// each would double the pages a restarted worker touches.)
std::vector<std::pair<at::Tensor, at::Tensor>> MatchModel(const Snapshot& snap, torch::nn::Module& model) {
  std::vector<std::pair<at::Tensor, at::Tensor>> loaded;
  auto take = [&](const std::string& name, const at::Tensor& live) {
    auto it = snap.tensors.find(name);
    if (it == snap.tensors.end()) throw std::runtime_error(name + " is not in the checkpoint");
    const SavedTensor& t = it->second;
    if (t.dtype != live.scalar_type() || !live.sizes().equals(t.sizes))
      throw std::runtime_error(name + " has a different shape or dtype");
    loaded.emplace_back(live, at::from_blob(const_cast<char*>(t.data), t.sizes, at::TensorOptions().dtype(t.dtype)));
  };
  for (const auto& p : model.named_parameters()) take("param/" + p.key(), p.value());
  for (const auto& b : model.named_buffers()) take("buffer/" + b.key(), b.value());
  return loaded;
}

// Throws if the snapshot's optimizer state cannot go into `optim`; its torch archive, if that is
// how it was saved, is read into `archive`.
void CheckOptimizer(const Snapshot& snap, torch::optim::Optimizer& optim,
                    std::optional<torch::serialize::InputArchive>* archive) {
  const OptimKind live_kind = KindOf(optim);
  if (snap.kind != OptimKind::kArchive && snap.kind != live_kind)
    throw std::runtime_error("saved with another optimizer type");
  if (snap.kind == OptimKind::kArchive) {
    archive->emplace();
    (*archive)->load_from(snap.data, snap.archive_size);
  }
  if (snap.lrs.size() != optim.param_groups().size())
    throw std::runtime_error("a different number of parameter groups");
}

void CopyInto(std::vector<std::pair<at::Tensor, at::Tensor>>& loaded) {
  at::NoGradGuard no_grad;
  for (auto& [dst, src] : loaded) {
    // Pages not yet present (a parameter under the prefaulting allocator's floor) come in one call.
    if (dst.device().is_cpu() && dst.is_contiguous()) PrefaultForWrite(dst.data_ptr(), dst.nbytes());
    dst.copy_(src);
  }
}

// The optimizer's per-parameter state, tensor by tensor (a snapshot of a known optimizer kind).
void RestoreOptimizerState(const Snapshot& snap, torch::optim::Optimizer& optim) {
  const std::vector<at::Tensor> params = FlatParams(optim);
  auto& map = optim.state();
  map.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string prefix = "optim/" + std::to_string(i) + "/";
    bool any = snap.ints.count(prefix + "step") > 0;
    for (auto it = snap.tensors.lower_bound(prefix);
         !any && it != snap.tensors.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      any = true;
    }
    if (!any) continue;
    auto get = [&](const char* field) {
      at::Tensor t = OwnCopy(snap, prefix + field);
      return t.defined() ? t.to(params[i].device()) : t;
    };
    const auto step = snap.ints.find(prefix + "step");
    map[StateKey<StateKeyType>(params[i])] = MakeState(snap.kind, get, step == snap.ints.end() ? 0 : step->second);
  }
}

// Loads a snapshot into the model and optimizer. Everything is checked against the payload's size
// before it is used, and against the model and optimizer before anything live changes; a mismatch
// throws (the caller tries an older checkpoint).
TrainState Restore(const char* payload, size_t size, torch::nn::Module& model, torch::optim::Optimizer& optim) {
  const Snapshot snap = ParseSnapshot(payload, size);
  std::vector<std::pair<at::Tensor, at::Tensor>> loaded = MatchModel(snap, model);
  at::Tensor rng = OwnCopy(snap, "rng/cpu");
  if (!rng.defined()) throw std::runtime_error("the RNG state is not in the checkpoint");
  std::optional<torch::serialize::InputArchive> archive;
  CheckOptimizer(snap, optim, &archive);

  CopyInto(loaded);
  if (archive) {
    optim.load(*archive);
  } else {
    RestoreOptimizerState(snap, optim);
  }
  for (size_t g = 0; g < snap.lrs.size(); ++g) optim.param_groups()[g].options().set_lr(snap.lrs[g]);
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
  return snap.state;
}

// The first format: a torch archive.
TrainState RestoreArchive(const char* payload, size_t size, torch::nn::Module& model, torch::optim::Optimizer& optim) {
  torch::serialize::InputArchive archive;
  archive.load_from(payload, size);
  torch::serialize::InputArchive m, o;
  archive.read("model", m);
  archive.read("optimizer", o);
  // Copied into the existing tensors, never re-pointed: DistributedDataParallel's autograd hooks
  // and the optimizer keep referring to the same parameters.
  std::vector<std::pair<at::Tensor, at::Tensor>> loaded;
  for (const auto& p : model.named_parameters()) {
    at::Tensor t;
    m.read(p.key(), t);
    if (!t.sizes().equals(p.value().sizes()))
      throw std::runtime_error("parameter " + p.key() + " has a different shape");
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
}

// Loads a checkpoint file of either format, its size and checksum checked first.
TrainState RestoreFile(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optim) {
  std::ifstream f(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  FileHeader h;
  if (data.size() < sizeof h) throw std::runtime_error("truncated header");
  std::memcpy(&h, data.data(), sizeof h);
  const bool archive = std::memcmp(h.magic, kMagicArchive, sizeof h.magic) == 0;
  if (!archive && std::memcmp(h.magic, kMagicSnapshot, sizeof h.magic) != 0)
    throw std::runtime_error("not a launch checkpoint");
  if (data.size() - sizeof h != h.payload_size) throw std::runtime_error("truncated (size mismatch)");
  const char* payload = data.data() + sizeof h;
  const uint64_t sum = archive ? Fnv1a64(payload, h.payload_size) : Checksum64(payload, h.payload_size);
  if (sum != h.checksum) throw std::runtime_error("checksum mismatch");
  return archive ? RestoreArchive(payload, h.payload_size, model, optim)
                 : Restore(payload, h.payload_size, model, optim);
}

// The ranks' minimum of `v` (every rank calls it).
int64_t MinOverRanks(const Context* ctx, int64_t v) {
  if (!ctx || ctx->world_size() <= 1 || !ctx->process_group()) return v;
  std::vector<at::Tensor> t = {at::tensor({v}, at::kLong).to(ctx->device())};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MIN;
  ctx->process_group()->allreduce(t, o)->wait();
  return t[0].to(at::kCPU).item<int64_t>();
}

// Whether a Checkpointer of this process has the agent's memory (LAUNCH_CHECKPOINT_MEMORY).
std::atomic<bool> g_memory_taken{false};

// "PATH,PATH" from LAUNCH_CHECKPOINT_MEMORY, split; throws when malformed.
std::pair<std::string, std::string> MemoryPaths(const std::string& list) {
  const size_t comma = list.find(',');
  if (comma == std::string::npos || list.size() > 2 * kMaxName || list.find(',', comma + 1) != std::string::npos)
    throw std::runtime_error(std::string(kCheckpointMemoryEnv) + "=" + list.substr(0, 200) +
                             ": expected two paths, comma separated");
  return {list.substr(0, comma), list.substr(comma + 1)};
}

}  // namespace

// A snapshot's place. In the agent's memory: a file launch made (LAUNCH_CHECKPOINT_MEMORY), mapped
// shared, a SlotHeader then the payload; it outlives this process. Otherwise this process's memory.
class Checkpointer::Slot {
 public:
  // Memory of this process.
  Slot() = default;
  // The agent's memory at `path`; throws with the reason when it cannot be mapped.
  explicit Slot(const std::string& path) : shared_(true) {
    if (std::optional<internal::Premapped> m = internal::TakePremapped(path)) {
      fd_ = m->fd;
      base_ = m->base;
      mapped_ = m->size;
      return;
    }
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error(path + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw std::runtime_error(path + ": not a memory file");
    }
    if (static_cast<size_t>(st.st_size) < kSlotPayload) {
      if (::ftruncate(fd_, kSlotPayload) != 0) {
        const int e = errno;
        ::close(fd_);
        throw std::runtime_error(path + ": " + std::strerror(e));
      }
      st.st_size = kSlotPayload;
    }
    Map(static_cast<size_t>(st.st_size));
  }
  ~Slot() {
    if (shared_ && base_) ::munmap(base_, mapped_);
    if (fd_ >= 0) ::close(fd_);
  }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;

  // Room for a payload of `n` bytes.
  void Reserve(size_t n) {
    if (!shared_) {
      if (heap_.size() < n) heap_.resize(n);
      return;
    }
    if (kSlotPayload + n <= mapped_) return;
    const size_t want = AlignUp(kSlotPayload + n, kGrowStep);
    if (::ftruncate(fd_, static_cast<off_t>(want)) != 0)
      throw std::runtime_error(std::string("checkpoint: cannot grow the agent's memory: ") + std::strerror(errno));
    ::munmap(base_, mapped_);
    base_ = nullptr;
    Map(want);
  }
  // The payload it has room for without growing.
  size_t capacity() const { return shared_ ? mapped_ - kSlotPayload : heap_.size(); }
  char* payload() { return shared_ ? static_cast<char*>(base_) + kSlotPayload : heap_.data(); }
  const char* payload() const { return shared_ ? static_cast<const char*>(base_) + kSlotPayload : heap_.data(); }
  // The slot's state, step, size and checksum (also in this process's memory, for one code path).
  SlotHeader& header() { return shared_ ? *static_cast<SlotHeader*>(base_) : local_header_; }
  const SlotHeader& header() const { return shared_ ? *static_cast<const SlotHeader*>(base_) : local_header_; }
  // The payload of a complete snapshot, bounded by what is mapped; 0 for none.
  size_t CompleteSize() const {
    const SlotHeader& h = header();
    if (std::memcmp(h.magic, kSlotMagic, sizeof kSlotMagic) != 0) return 0;
    if (__atomic_load_n(&h.state, __ATOMIC_ACQUIRE) != kComplete) return 0;
    const size_t room = shared_ ? mapped_ - kSlotPayload : heap_.size();
    return h.payload_size <= room ? h.payload_size : 0;
  }
  void SetState(uint64_t s) { __atomic_store_n(&header().state, s, __ATOMIC_RELEASE); }

 private:
  void Map(size_t n) {
    // Populated at once: one call instead of a fault per page when the snapshot is read or written.
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error(std::string("checkpoint: cannot map the agent's memory: ") + std::strerror(errno));
    base_ = p;
    mapped_ = n;
  }
  bool shared_ = false;
  int fd_ = -1;
  void* base_ = nullptr;
  size_t mapped_ = 0;
  std::vector<char> heap_;
  SlotHeader local_header_{};
};

uint64_t Fnv1a64(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t Checksum64(const void* data, size_t n) {
  constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull;
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  auto round = [&](uint64_t acc, uint64_t w) { return rotl(acc + w * kP2, 31) * kP1; };
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t v[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, sizeof w);
    for (int k = 0; k < 4; ++k) v[k] = round(v[k], w[k]);
  }
  uint64_t h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18) + n;
  for (; i < n; ++i) h = rotl(h ^ (p[i] * kP3), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  return h ^ (h >> 32);
}

void TouchPremappedCheckpointMemory() { internal::TouchPremapped(); }

void PremapCheckpointMemory() {
  const char* mem = std::getenv(kCheckpointMemoryEnv);
  if (!mem || !*mem) return;
  std::pair<std::string, std::string> paths;
  try {
    paths = MemoryPaths(mem);
  } catch (const std::exception&) {
    return;  // the Checkpointer says so, in the worker
  }
  // Only a slot that holds a snapshot: an empty one is sized by the worker's first save.
  for (const std::string& path : {paths.first, paths.second}) internal::Premap(path, kSlotPayload);
}

Checkpointer::Checkpointer(std::string dir, int keep_last) : dir_(std::move(dir)), keep_last_(keep_last) {
  if (keep_last_ < 1) throw std::invalid_argument("Checkpointer: keep_last must be >= 1");
  local_ = std::make_unique<Slot>();
}

Checkpointer::Checkpointer(std::string dir, const Context& ctx, CheckpointOptions opts)
    : Checkpointer(std::move(dir), opts.keep_last) {
  ctx_ = &ctx;
  const char* mem = std::getenv(kCheckpointMemoryEnv);
  if (!opts.in_memory || !mem || !*mem) return;
  try {
    // One Checkpointer of a process has them: a second would overwrite the first's snapshots.
    if (g_memory_taken.exchange(true))
      throw std::runtime_error("another Checkpointer of this process keeps its snapshots there");
    // "PATH,PATH": this local rank's two memory slots.
    const auto [first, second] = MemoryPaths(mem);
    std::vector<std::unique_ptr<Slot>> slots;
    slots.push_back(std::make_unique<Slot>(first));
    slots.push_back(std::make_unique<Slot>(second));
    slots_ = std::move(slots);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] launch_sdk: checkpoints are written to disk only: %s\n", ctx.rank(), e.what());
    return;
  }
  owns_memory_ = true;
  writer_ = std::thread([this] { WriterLoop(); });
  filer_ = std::thread([this] { FileLoop(); });
}

Checkpointer::~Checkpointer() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    WaitIdle(lock);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (filer_.joinable()) filer_.join();
  slots_.clear();
  if (owns_memory_) g_memory_taken = false;
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

void Checkpointer::WaitIdle(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [this] { return jobs_.empty() && !busy_ && files_.empty() && !filing_; });
}

void Checkpointer::WaitFor(Slot* slot, std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [&] {
    if (busy_ == slot || Filing(slot)) return false;
    for (const Job& j : jobs_)
      if (j.slot == slot) return false;
    return true;
  });
}

void Checkpointer::RethrowWriterError(std::unique_lock<std::mutex>& lock) {
  if (!writer_error_) return;
  std::exception_ptr e = writer_error_;
  writer_error_ = nullptr;
  lock.unlock();
  std::rethrow_exception(e);
}

void Checkpointer::Save(const TrainState& state, torch::nn::Module& model, torch::optim::Optimizer& optim, int rank) {
  const bool memory = in_memory();
  if (!memory && rank != 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  Slot* slot = local_.get();
  if (memory) {
    // Not the slot of the last save, which the writer may still be finishing; in a new process,
    // not the one that holds the newest complete snapshot: that one stays loadable meanwhile.
    Slot* a = slots_[0].get();
    Slot* b = slots_[1].get();
    if (last_slot_) {
      slot = last_slot_ == a ? b : a;
    } else {
      const bool a_newer = a->CompleteSize() && (!b->CompleteSize() || a->header().step >= b->header().step);
      slot = a_newer ? b : a;
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  // A file that takes longer to write than the interval between two saves holds the second one
  // back here (the slot it reuses is still being written out).
  WaitFor(slot, lock);
  RethrowWriterError(lock);
  lock.unlock();
  Layout l = Plan(state, model, optim);
  slot->Reserve(l.total);
  slot->SetState(kWriting);
  SlotHeader& h = slot->header();
  std::memcpy(h.magic, kSlotMagic, sizeof kSlotMagic);
  h.step = state.step;
  h.payload_size = l.total;
  Fill(l, slot->payload());
  last_stall_seconds_ = SecondsSince(t0);
  Job job{slot, rank == 0};
  if (!memory) {
    Complete(job);
    if (job.write_file) WriteFile(*slot);
    last_stall_seconds_ = SecondsSince(t0);
    return;
  }
  last_slot_ = slot;
  lock.lock();
  // The other slot gets the room the next save needs first, on the writer: new memory is faulted
  // in page by page (0.35 s for 295 MB here), which would otherwise be the next save's stall (or
  // its wait, were it queued behind this save's file).
  Slot* other = slot == slots_[0].get() ? slots_[1].get() : slots_[0].get();
  if (other->capacity() < l.total) jobs_.push_back(Job{other, false, l.total});
  jobs_.push_back(job);
  lock.unlock();
  cv_.notify_all();
}

void Checkpointer::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  WaitIdle(lock);
  RethrowWriterError(lock);
}

void Checkpointer::WriterLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping with nothing left
    const Job job = jobs_.front();
    // Growing a slot maps it anew: not while its file is still to be written from it.
    if (job.reserve) cv_.wait(lock, [&] { return !Filing(job.slot); });
    jobs_.pop_front();
    busy_ = job.slot;
    lock.unlock();
    bool complete = true;
    try {
      Complete(job);
    } catch (const std::exception& e) {
      complete = false;
      NoteWriterError(*job.slot, e);
    }
    lock.lock();
    busy_ = nullptr;
    if (complete && job.write_file) files_.push_back(job.slot);
    cv_.notify_all();
  }
}

void Checkpointer::FileLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return (stop_ && !busy_ && jobs_.empty()) || !files_.empty(); });
    if (files_.empty()) return;  // stopping with nothing left
    filing_ = files_.front();
    files_.pop_front();
    lock.unlock();
    try {
      WriteFile(*filing_);
    } catch (const std::exception& e) {
      NoteWriterError(*filing_, e);
    }
    lock.lock();
    filing_ = nullptr;
    cv_.notify_all();
  }
}

bool Checkpointer::Filing(const Slot* slot) const {
  return filing_ == slot || std::find(files_.begin(), files_.end(), slot) != files_.end();
}

void Checkpointer::NoteWriterError(const Slot& slot, const std::exception& e) {
  std::fprintf(stderr, "launch_sdk: checkpoint of step %lld not written: %s\n",
               static_cast<long long>(slot.header().step), e.what());
  std::lock_guard<std::mutex> lock(mu_);
  writer_error_ = std::current_exception();
}

void Checkpointer::Complete(const Job& job) {
  if (job.reserve) {
    job.slot->Reserve(job.reserve);
    return;
  }
  SlotHeader& h = job.slot->header();
  h.checksum = Checksum64(job.slot->payload(), h.payload_size);
  job.slot->SetState(kComplete);
}

void Checkpointer::WriteFile(const Slot& slot) {
  const SlotHeader& sh = slot.header();
  fs::create_directories(dir_);
  const std::string final_path = (fs::path(dir_) / FileName(sh.step)).string();
  const std::string tmp_path = final_path + ".tmp";
  FileHeader h;
  std::memcpy(h.magic, kMagicSnapshot, sizeof kMagicSnapshot);
  h.payload_size = sh.payload_size;
  h.checksum = sh.checksum;
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("checkpoint: open " + tmp_path + ": " + std::strerror(errno));
  try {
    WriteFully(fd, reinterpret_cast<const char*>(&h), sizeof h, tmp_path);
    WriteFully(fd, slot.payload(), sh.payload_size, tmp_path);
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
  {
    std::unique_lock<std::mutex> lock(mu_);
    WaitIdle(lock);
  }
  loaded_from_.clear();
  // What this rank could load: memory slots, then files; by step.
  struct Candidate {
    int64_t step;
    Slot* slot;        // or
    std::string path;  // a file
  };
  std::vector<Candidate> candidates;
  for (auto& s : slots_)
    if (s->CompleteSize()) candidates.push_back({s->header().step, s.get(), ""});
  for (const std::string& path : List()) {
    try {
      candidates.push_back({StepOf(fs::path(path).filename().string()), nullptr, path});
    } catch (const std::exception&) {
    }
  }
  // Newest first; memory before a file of the same step.
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.step > b.step || (a.step == b.step && a.slot && !b.slot);
  });

  auto try_load = [&](const Candidate& c) -> std::optional<TrainState> {
    const std::string where = c.slot ? "in memory" : c.path;
    try {
      if (c.slot) {
        const size_t n = c.slot->CompleteSize();
        if (!n) throw std::runtime_error("overwritten");
        if (Checksum64(c.slot->payload(), n) != c.slot->header().checksum)
          throw std::runtime_error("checksum mismatch");
        TrainState s = Restore(c.slot->payload(), n, model, optim);
        loaded_from_ = "memory";
        return s;
      }
      TrainState s = RestoreFile(c.path, model, optim);
      loaded_from_ = c.path;
      return s;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "launch_sdk: skipping checkpoint %s: %s\n", where.c_str(), e.what());
      return std::nullopt;
    }
  };

  // Every rank resumes from the same step: the newest one every rank has, each from its memory or
  // a file; if any rank cannot load it, all try the next older one.
  std::vector<bool> failed(candidates.size(), false);
  int64_t bound = INT64_MAX;
  for (;;) {
    int64_t best = -1;
    for (size_t i = 0; i < candidates.size(); ++i)
      if (!failed[i] && candidates[i].step <= bound) best = std::max(best, candidates[i].step);
    const int64_t step = MinOverRanks(ctx_, best);
    if (step < 0) return std::nullopt;
    std::optional<TrainState> s;
    for (size_t i = 0; i < candidates.size() && !s; ++i) {
      if (failed[i] || candidates[i].step != step) continue;
      s = try_load(candidates[i]);
      if (!s) failed[i] = true;
    }
    if (MinOverRanks(ctx_, s ? 1 : 0) == 1) {
      // Resumed from memory that no file holds yet: rank 0 writes it, in the background.
      if (loaded_from_ == "memory" && ctx_ && ctx_->rank() == 0 && !fs::exists(fs::path(dir_) / FileName(s->step))) {
        for (auto& slot : slots_) {
          if (slot->CompleteSize() && slot->header().step == s->step) {
            std::lock_guard<std::mutex> lock(mu_);
            jobs_.push_back(Job{slot.get(), true});
            last_slot_ = slot.get();
            cv_.notify_all();
            break;
          }
        }
      }
      return s;
    }
    bound = step - 1;
  }
}

}  // namespace launch_sdk
