// Stop signals: SIGTERM, SIGUSR1 and SIGINT ask the job to checkpoint the current step and stop
// with exit status 0 (docs/reliability.md). Every rank checks at the same points and the ranks
// agree (an all-reduce), so all of them checkpoint the same step.
#pragma once

#include "quintet/comm/mpi_communicator.hpp"

namespace quintet {

void install_stop_signals();
bool stop_requested();                               // this rank received one
bool stop_agreed(const MpiCommunicator& world);      // any rank received one (collective)

}  // namespace quintet
