#include "agent/coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"

namespace launch {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

GrpcCoordinatorClient::GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                             std::chrono::seconds join_timeout)
    : stub_(v1::Rendezvous::NewStub(channel)), join_timeout_(join_timeout) {}

namespace {
void SetDeadline(grpc::ClientContext* ctx, std::chrono::seconds d) {
  ctx->set_deadline(std::chrono::system_clock::now() + d);
}
}  // namespace

absl::StatusOr<v1::Assignment> GrpcCoordinatorClient::Join(const v1::JoinRequest& req) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, join_timeout_ + std::chrono::seconds(5));
  ctx.set_wait_for_ready(true);
  v1::JoinResponse resp;
  grpc::Status s = stub_->Join(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, "rendezvous join");
  return resp.assignment();
}

absl::StatusOr<v1::HeartbeatResponse> GrpcCoordinatorClient::Heartbeat(
    const v1::HeartbeatRequest& req) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, std::chrono::seconds(5));
  v1::HeartbeatResponse resp;
  grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, "heartbeat");
  return resp;
}

absl::StatusOr<v1::ReportExitResponse> GrpcCoordinatorClient::ReportExit(
    const v1::ReportExitRequest& req) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, std::chrono::seconds(10));
  v1::ReportExitResponse resp;
  grpc::Status s = stub_->ReportExit(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, "report exit");
  return resp;
}

}  // namespace launch
