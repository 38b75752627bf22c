// Errors in tiers (see docs/architecture.md, "Errors", and docs/reliability.md):
//  - ConfigError: deterministic (deck, layout, data header). Every rank detects it identically,
//    so main() prints it once from rank 0 and finalises cleanly with exit status 2.
//  - everything else (I/O, a rank-local failure): main() prints "rank N: ..." and MPI_Abort()s,
//    so the job never hangs waiting for the failed rank.
#pragma once
#include <stdexcept>
#include <string>

namespace quintet {

// A failure every rank sees identically; safe to end the job collectively.
struct ConfigError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A failure of this rank only (file system, library call); the job must be aborted.
struct RankError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Training diverged (a non-finite loss or gradient that a rerun reproduced, or non-finite
// weights before a checkpoint). Every rank decides it from all-reduced values, so the job ends
// collectively with exit status 3 (docs/reliability.md, "Exit statuses") after rank 0 prints it.
struct DivergedError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// An I/O failure during the run (a checkpoint or metrics write: disk full, a file system error):
// the job ends with exit status 4, a transient fault (docs/reliability.md), after the earlier
// checkpoints were left intact.
struct IoError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A transient fault every rank agreed on (an interrupted or failed `quintet prepare` that cleaned
// up after itself): exit status 4, printed once by rank 0, ended without MPI_Abort.
struct FaultError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// "deck key 'model.n_heads' = 7: must be divisible by parallel.tp = 2"
[[noreturn]] void config_fail(const std::string& key, const std::string& value,
                              const std::string& valid);
[[noreturn]] void rank_fail(const std::string& what);

// Checks a condition at file:line; throws RankError with the text.
#define QUINTET_CHECK(cond, msg)                                                          \
    do {                                                                                  \
        if (!(cond))                                                                      \
            ::quintet::rank_fail(std::string(__FILE__ ":") + std::to_string(__LINE__) +   \
                                 ": " + (msg));                                           \
    } while (0)

}  // namespace quintet
