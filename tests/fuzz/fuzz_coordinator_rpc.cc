// libFuzzer target: every coordinator RPC handler fed arbitrary protobuf messages, through gRPC's
// in-process channel (a coordinator in memory; no socket is used). The first byte picks the RPC,
// the rest is parsed as its request (whatever protobuf makes of it). The coordinator must answer
// every call (an error status is fine) and never crash; each call has a short deadline, so a held
// join gives up and is cancelled, which is a path of its own.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "common/clock.h"
#include "launch.grpc.pb.h"
#include "rendezvous/coordinator.h"
#include "spdlog/spdlog.h"

namespace {

struct Fixture {
  Fixture() {
    spdlog::set_level(spdlog::level::off);  // every refusal logs a line
    auto s = launch::CoordinatorServer::Start("127.0.0.1:0", launch::CoordinatorOptions{}, launch::SecurityOptions{},
                                              &clock);
    if (!s.ok()) std::abort();
    server = std::move(*s);
    stub = launch::v1::Rendezvous::NewStub(server->InProcessChannel());
  }
  launch::SystemClock clock;
  std::unique_ptr<launch::CoordinatorServer> server;
  std::unique_ptr<launch::v1::Rendezvous::Stub> stub;
};

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(20));
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* f = new Fixture();  // one coordinator for the whole run, as in production
  if (size == 0) return 0;
  const uint8_t op = data[0] % 6;
  const void* body = data + 1;
  const int n = static_cast<int>(size - 1);
  switch (op) {
    case 0: {
      launch::v1::JoinRequest req;
      req.ParseFromArray(body, n);
      launch::v1::JoinResponse resp;
      (void)f->stub->Join(Ctx().get(), req, &resp);
      break;
    }
    case 1: {
      launch::v1::HeartbeatRequest req;
      req.ParseFromArray(body, n);
      launch::v1::HeartbeatResponse resp;
      (void)f->stub->Heartbeat(Ctx().get(), req, &resp);
      break;
    }
    case 2: {
      launch::v1::ReportExitRequest req;
      req.ParseFromArray(body, n);
      launch::v1::ReportExitResponse resp;
      (void)f->stub->ReportExit(Ctx().get(), req, &resp);
      break;
    }
    case 3: {
      launch::v1::StatusRequest req;
      req.ParseFromArray(body, n);
      launch::v1::StatusResponse resp;
      (void)f->stub->Status(Ctx().get(), req, &resp);
      break;
    }
    case 4: {
      // A Watch stream: the body is two heartbeats (split at its middle) written in turn.
      auto ctx = Ctx();
      auto stream = f->stub->Watch(ctx.get());
      launch::v1::HeartbeatRequest a, b;
      a.ParseFromArray(body, n / 2);
      b.ParseFromArray(data + 1 + n / 2, n - n / 2);
      if (stream->Write(a)) stream->Write(b);
      stream->WritesDone();
      launch::v1::HeartbeatResponse resp;
      while (stream->Read(&resp)) {
      }
      (void)stream->Finish();
      break;
    }
    case 5: {
      launch::v1::SampleRequest req;
      req.ParseFromArray(body, n);
      launch::v1::SampleResponse resp;
      (void)f->stub->Sample(Ctx().get(), req, &resp);
      break;
    }
  }
  return 0;
}
