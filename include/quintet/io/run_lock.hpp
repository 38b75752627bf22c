// One run per run_dir (docs/reliability.md): rank 0 holds run_dir/lock, a file created with
// O_EXCL that names the holder ("host pid start-time"), for as long as the job runs. A second
// job in the same folder is refused (ConfigError, exit status 2) naming the holder. A lock left
// by a killed job is recognised as stale -- on the same host when its pid is gone; on another
// host when the holder has not refreshed it (touch() every step) for `stale_after_s` -- and taken
// over with a warning.
#pragma once
#include <string>

#include "quintet/comm/mpi_communicator.hpp"

namespace quintet {

class RunLock {
public:
    // collective over comm. warning: set when a stale lock was taken over. `what` names the folder's
    // owner in the refusal (default "output.run_dir '<run_dir>'").
    RunLock(const std::string& run_dir, const MpiCommunicator& comm, double stale_after_s, std::string* warning,
            const std::string& what = "");
    ~RunLock();  // releases (rank 0)
    RunLock(const RunLock&) = delete;
    RunLock& operator=(const RunLock&) = delete;
    void touch() const;  // rank 0: refresh the lock's time (the holder is alive)
    void remove_folder_when_released() { created_ = true; }  // the folder goes too if it is empty then

private:
    std::string path_, dir_;
    bool held_ = false, created_ = false;  // created_: run_dir did not exist before the lock
};

}  // namespace quintet
