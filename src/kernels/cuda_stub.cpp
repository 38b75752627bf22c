// Built when QUINTET_CUDA resolves OFF: selecting train.device = cuda fails clearly at start.
#include "quintet/core/error.hpp"
#include "quintet/kernels/backend.hpp"

namespace quintet {

bool cuda_available() { return false; }

std::unique_ptr<Backend> make_cuda_backend(int) {
    config_fail("train.device", "cuda",
                "this quintet was built without CUDA (configure with -DQUINTET_CUDA=ON on a machine "
                "with the CUDA toolkit); valid here: cpu");
}

}  // namespace quintet
