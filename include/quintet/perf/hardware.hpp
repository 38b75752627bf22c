// What a cluster is made of, for the planner (docs/planner.md §6): per device its dense peaks,
// memory capacity and bandwidth and its best achievable GEMM fraction; per node how many devices
// it has, the link between them (NVLink) and the network to other nodes. Built-in descriptions
// of common GPUs (`quintet plan --hardware a100-sxm-80g | h100-sxm | h200`), `host` for this
// machine as measured (the CPU model of perf/planner.cpp), or a file in the deck's syntax.
#pragma once
#include <string>
#include <vector>

namespace quintet {

struct Hardware {
    std::string name;    // the built-in name, or the file it was read from
    bool host = false;   // `host`: this machine, measured (MachineModel); no figures below
    // Per device.
    double bf16_tflops = 0;     // dense bf16 tensor peak, TFLOP/s
    double fp32_tflops = 0;     // dense fp32 peak (non-tensor: what fp32 GEMMs run at), TFLOP/s
    double memory_gib = 0;      // capacity the device reports, GiB
    double memory_gbs = 0;      // memory bandwidth, GB/s
    double matmul_fraction = 0.80;  // best achievable GEMM fraction of the peak (brute-force shape search)
    int sms = 0;                // streaming multiprocessors (GEMM wave quantisation); 0 = not modelled
    // Per node.
    int devices_per_node = 0;
    double link_gbs = 0;            // intra-node link per device and direction (NVLink), GB/s
    double link_latency_us = 3.4;   // per collective step inside a node
    double network_gbs = 0;         // network per device and direction, GB/s
    double network_latency_us = 0;  // per collective step across nodes
    double peak_tflops(bool bf16) const { return bf16 ? bf16_tflops : fp32_tflops; }
    double memory_bytes() const { return memory_gib * 1073741824.0; }
};

// The built-in names, `host` first.
std::vector<std::string> hardware_names();
// A built-in name or a hardware file. Throws ConfigError naming the valid names (an unknown
// name that is not a readable file) or the file's bad key, its value and what is valid.
Hardware hardware_load(const std::string& name_or_file);
// The text of a hardware file (`where` names it in errors).
Hardware hardware_parse(const std::string& text, const std::string& where);
// A description as a hardware file (every key, with its meaning as a comment).
std::string hardware_to_text(const Hardware& hw);

}  // namespace quintet
