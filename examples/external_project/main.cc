// Joins the process group launch (or torchrun) set up, all-reduces its rank, prints the sum.
#include <ATen/ATen.h>

#include <cstdio>

#include "launch_sdk/context.h"
#include "launch_sdk/errors.h"

int main() {
  return launch_sdk::RunWithErrorFile([] {
    auto ctx = launch_sdk::Context::Init();
    std::vector<at::Tensor> t = {at::full({1}, static_cast<float>(ctx->rank() + 1))};
    ctx->process_group()->allreduce(t)->wait();
    std::printf("rank %d of %d on %s: allreduce=%g\n", ctx->rank(), ctx->world_size(), ctx->backend(),
                t[0].item<float>());
    return 0;
  });
}
