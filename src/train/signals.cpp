#include "quintet/train/signals.hpp"

#include <csignal>

namespace quintet {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

void install_stop_signals() {
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGUSR1, on_stop_signal);
    std::signal(SIGINT, on_stop_signal);
}

bool stop_requested() { return g_stop_signal != 0; }

bool stop_agreed(const MpiCommunicator& world) {
    double stop = g_stop_signal ? 1.0 : 0.0;
    world.all_reduce_max(&stop, 1);
    return stop > 0;
}

}  // namespace quintet
