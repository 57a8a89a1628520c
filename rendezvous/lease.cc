#include "rendezvous/lease.h"

#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/tunables.h"
#include "common/thread_name.h"

namespace launch {

namespace {

constexpr char kMagic[3] = {'L', 'B', '1'};
constexpr size_t kMacBytes = 32;

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetU64(std::string_view in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

std::string Mac(std::string_view data, const std::string& key) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), mac, &len);
  return std::string(reinterpret_cast<char*>(mac), len);
}

// A UDP socket bound to (listen) or connected to (!listen) host:port: the first address of the
// host's that works.
absl::StatusOr<UniqueFd> OpenUdp(const std::string& host, int port, bool listen) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = listen ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0 || res == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", ::gai_strerror(rc)));
  }
  const char* verb = listen ? "bind" : "reach";
  absl::Status st = absl::UnavailableError(absl::StrCat("cannot ", verb, " UDP ", host, ":", port));
  UniqueFd out;
  for (addrinfo* ai = res; ai != nullptr && !out.valid(); ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd.valid()) continue;
    if (listen) {
      // A burst of datagrams waits here while a batch is handled: past net.core.rmem_max when
      // launch may (root), else as much as it allows.
      int rcvbuf = 4 << 20;
      if (::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) != 0) {
        ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
      }
    }
    if ((listen ? ::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) : ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen)) !=
        0) {
      st = absl::UnavailableError(absl::StrCat("cannot ", verb, " UDP ", host, ":", port, ": ", std::strerror(errno)));
      continue;
    }
    out = std::move(fd);
  }
  ::freeaddrinfo(res);
  if (!out.valid()) return st;
  return out;
}

}  // namespace

std::string NewLeaseKey() {
  std::string key(kLeaseKeyBytes, '\0');
  size_t got = 0;
  while (got < key.size()) {
    ssize_t n = ::getrandom(key.data() + got, key.size() - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return key;
}

std::string NodeLeaseKey(const std::string& run_key, const std::string& node_id) {
  return Mac(absl::StrCat("launch lease key of node ", node_id), run_key);
}

absl::StatusOr<std::string> EncodeLeaseBeat(const LeaseBeat& beat, const std::string& key) {
  if (beat.run_id.size() > kMaxRunIdLength || beat.node_id.size() > kMaxNodeIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("run id over ", kMaxRunIdLength, " or node id over ", kMaxNodeIdLength, " bytes"));
  }
  std::string out(kMagic, sizeof kMagic);
  out.push_back(static_cast<char>(beat.run_id.size()));
  out += beat.run_id;
  out.push_back(static_cast<char>(beat.node_id.size()));
  out += beat.node_id;
  PutU64(&out, static_cast<uint64_t>(beat.round));
  PutU64(&out, beat.seq);
  out += Mac(out, key);
  return out;
}

std::optional<LeaseBeat> DecodeLeaseBeat(std::string_view d, const LeaseKeyLookup& key_for) {
  if (d.size() < LeaseDatagramBytes(0, 0) || d.size() > kMaxLeaseDatagram ||
      std::memcmp(d.data(), kMagic, sizeof kMagic) != 0) {
    return std::nullopt;
  }
  size_t pos = sizeof kMagic;
  LeaseBeat b;
  const size_t run_len = static_cast<unsigned char>(d[pos++]);
  if (pos + run_len + 1 > d.size()) return std::nullopt;
  b.run_id = std::string(d.substr(pos, run_len));
  pos += run_len;
  const size_t node_len = static_cast<unsigned char>(d[pos++]);
  if (pos + node_len + 16 + kMacBytes != d.size()) return std::nullopt;
  b.node_id = std::string(d.substr(pos, node_len));
  pos += node_len;
  b.round = static_cast<int64_t>(GetU64(d.substr(pos, 8)));
  b.seq = GetU64(d.substr(pos + 8, 8));
  pos += 16;
  const std::string* key = key_for(b.run_id, b.node_id);
  if (key == nullptr) return std::nullopt;
  const std::string mac = Mac(d.substr(0, pos), *key);
  if (mac.size() != kMacBytes || CRYPTO_memcmp(mac.data(), d.data() + pos, kMacBytes) != 0) return std::nullopt;
  return b;
}

absl::Status LeaseListener::Start(const std::string& host, int port, OnBatch on_batch) {
  auto fd = OpenUdp(host, port, /*listen=*/true);
  if (!fd.ok()) return fd.status();
  fd_ = std::move(*fd);
  stop_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_.valid()) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  on_batch_ = std::move(on_batch);
  thread_ = std::thread([this] {
    NameThisThread("launch-lease");
    Loop();
  });
  return absl::OkStatus();
}

void LeaseListener::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  ssize_t n = ::write(stop_.get(), &one, sizeof one);
  (void)n;
  thread_.join();
}

void LeaseListener::Loop() {
  constexpr int kBatch = 64;
  std::vector<std::string> bufs(kBatch, std::string(kMaxLeaseDatagram, '\0'));
  iovec iov[kBatch];
  mmsghdr msgs[kBatch];
  std::vector<std::string> batch;
  for (;;) {
    pollfd p[2] = {{fd_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents & POLLIN) return;
    batch.clear();
    for (;;) {  // drain what is queued, a batch of datagrams per call
      for (int i = 0; i < kBatch; ++i) {
        iov[i] = {bufs[i].data(), bufs[i].size()};
        std::memset(&msgs[i], 0, sizeof msgs[i]);
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      int n = ::recvmmsg(fd_.get(), msgs, kBatch, MSG_DONTWAIT, nullptr);
      if (n <= 0) break;
      for (int i = 0; i < n; ++i) {
        if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) continue;
        batch.emplace_back(bufs[i].data(), msgs[i].msg_len);
      }
      if (n < kBatch) break;
    }
    if (!batch.empty()) on_batch_(batch);
    // Thousands of agents' datagrams come evenly spread: woken for each, this thread would spend
    // more on wake-ups than on leases, so it waits a little before the next read and what arrives
    // meanwhile waits in the socket's buffer; not after a large batch, which says the buffer fills.
    if (batch.size() < kBatch) {
      pollfd stop = {stop_.get(), POLLIN, 0};
      if (::poll(&stop, 1, static_cast<int>(kLeaseBatchPeriod.count())) > 0) return;
    }
  }
}

absl::Status LeaseSender::Connect(const std::string& host, int port) {
  auto fd = OpenUdp(host, port, /*listen=*/false);
  if (!fd.ok()) return fd.status();
  fd_ = std::move(*fd);
  return absl::OkStatus();
}

void LeaseSender::Send(const std::string& datagram) {
  if (!fd_.valid()) return;
  ssize_t n = ::send(fd_.get(), datagram.data(), datagram.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)n;
}

}  // namespace launch
