// Hardware descriptions: the built-in table and the hardware file (docs/planner.md §6 gives
// every figure's source).
#include "quintet/perf/hardware.hpp"

#include <boost/program_options.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "quintet/core/error.hpp"

namespace po = boost::program_options;

namespace quintet {

namespace {

// The built-in descriptions. Peaks are the datasheets' dense (not "with sparsity") figures;
// capacities what the devices report (nvidia-smi: 81920, 81559, 143771 MiB); matmul_fraction the
// best bf16 GEMM rate found by a brute-force shape search (A100 267.9, H100 792.1 TFLOP/s; the
// H200 has the H100's die); links the line rates per direction (NVLink 3: 12 x 25 GB/s, NVLink 4:
// 18 links, 900 GB/s both ways); networks one NIC per GPU (HDR 200 Gb/s, NDR 400 Gb/s); latencies
// the per-step figures of NCCL's own tuning model (ring, Simple protocol).
Hardware a100() {
    Hardware h;
    h.name = "a100-sxm-80g";
    h.bf16_tflops = 312, h.fp32_tflops = 19.5, h.memory_gib = 80.0, h.memory_gbs = 2039;
    h.matmul_fraction = 267.9 / 312, h.sms = 108;
    h.devices_per_node = 8, h.link_gbs = 300, h.link_latency_us = 3.4, h.network_gbs = 25, h.network_latency_us = 9.6;
    return h;
}
Hardware h100() {
    Hardware h;
    h.name = "h100-sxm";
    h.bf16_tflops = 989.4, h.fp32_tflops = 66.9, h.memory_gib = 81559.0 / 1024, h.memory_gbs = 3350;
    h.matmul_fraction = 792.1 / 989.4, h.sms = 132;
    h.devices_per_node = 8, h.link_gbs = 450, h.link_latency_us = 3.4, h.network_gbs = 50, h.network_latency_us = 9.6;
    return h;
}
Hardware h200() {
    Hardware h = h100();
    h.name = "h200";
    h.memory_gib = 143771.0 / 1024, h.memory_gbs = 4800;
    return h;
}

std::string names_text() {
    std::string s;
    for (const auto& n : hardware_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
}

std::string fmt(double v) {
    std::ostringstream o;
    o.precision(17);
    o << v;
    return o.str();
}

struct Key {
    std::string key, help;
    bool required;
    std::function<void(Hardware&, const std::string&, const std::string&)> set;  // (hw, value, where)
    std::function<std::string(const Hardware&)> get;
};

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& v, const std::string& valid) {
    throw ConfigError("hardware file '" + where + "': '" + key + "' = '" + v + "': " + valid);
}

Key number(const std::string& key, double Hardware::*field, bool required, double hi, std::string help,
           bool zero_ok = false) {
    return {key, help, required,
            [=](Hardware& h, const std::string& v, const std::string& where) {
                size_t pos = 0;
                double x = 0;
                try { x = std::stod(v, &pos); } catch (...) { pos = 0; }
                if (pos == 0 || pos != v.size() || !std::isfinite(x) || x < 0 || (!zero_ok && x == 0) || x > hi)
                    bad(where, key, v, std::string("expected a number in ") + (zero_ok ? "[0, " : "(0, ") + fmt(hi) + "]");
                h.*field = x;
            },
            [=](const Hardware& h) { return fmt(h.*field); }};
}

Key integer(const std::string& key, int Hardware::*field, bool required, long lo, long hi, std::string help) {
    return {key, help, required,
            [=](Hardware& h, const std::string& v, const std::string& where) {
                size_t pos = 0;
                long x = 0;
                try { x = std::stol(v, &pos); } catch (...) { pos = 0; }
                if (pos == 0 || pos != v.size() || x < lo || x > hi)
                    bad(where, key, v, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
                h.*field = int(x);
            },
            [=](const Hardware& h) { return std::to_string(h.*field); }};
}

std::vector<Key> keys() {
    return {
        number("device.bf16_tflops", &Hardware::bf16_tflops, true, 1e6, "dense bf16 tensor peak per device, TFLOP/s"),
        number("device.fp32_tflops", &Hardware::fp32_tflops, true, 1e6, "dense fp32 peak per device (what fp32 GEMMs run at), TFLOP/s"),
        number("device.memory_gib", &Hardware::memory_gib, true, 1e6, "memory capacity per device as it reports it, GiB"),
        number("device.memory_gbs", &Hardware::memory_gbs, true, 1e7, "memory bandwidth per device, GB/s"),
        number("device.matmul_fraction", &Hardware::matmul_fraction, false, 1,
               "best achievable fraction of the peak for a GEMM of the best shape (optional, default 0.8)"),
        integer("device.sms", &Hardware::sms, false, 0, 1 << 20,
                "streaming multiprocessors, for GEMM wave quantisation (optional; 0 = not modelled)"),
        integer("node.devices", &Hardware::devices_per_node, true, 1, 1 << 20, "devices per node"),
        number("node.link_gbs", &Hardware::link_gbs, true, 1e6, "intra-node link (NVLink) per device and direction, GB/s"),
        number("node.link_latency_us", &Hardware::link_latency_us, false, 1e6,
               "latency of one collective step inside a node, us (optional, default 3.4)", true),
        number("node.network_gbs", &Hardware::network_gbs, true, 1e6, "network bandwidth per device and direction, GB/s"),
        number("node.network_latency_us", &Hardware::network_latency_us, true, 1e6,
               "latency of one collective step across nodes, us", true),
    };
}

}  // namespace

std::vector<std::string> hardware_names() { return {"host", "a100-sxm-80g", "h100-sxm", "h200"}; }

Hardware hardware_parse(const std::string& text, const std::string& where) {
    std::vector<Key> ks = keys();
    po::options_description desc("hardware keys");
    for (const auto& k : ks) desc.add_options()(k.key.c_str(), po::value<std::string>());
    std::istringstream in(text);
    po::parsed_options parsed(&desc);
    try {
        parsed = po::parse_config_file(in, desc, true);
    } catch (const po::error& e) {
        throw ConfigError("hardware file '" + where + "': " + e.what());
    }
    Hardware h;
    h.name = where;
    std::vector<bool> seen(ks.size(), false);
    for (const auto& o : parsed.options) {
        size_t i = 0;
        while (i < ks.size() && ks[i].key != o.string_key) ++i;
        if (i == ks.size()) {
            std::string valid;
            for (const auto& k : ks) valid += (valid.empty() ? "" : ", ") + k.key;
            throw ConfigError("hardware file '" + where + "': unknown key '" + o.string_key + "' (valid: " + valid + ")");
        }
        std::string v = o.value.empty() ? "" : o.value.back();
        if (const auto hash = v.find('#'); hash != std::string::npos) v = v.substr(0, hash);
        while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
        while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.erase(0, 1);
        ks[i].set(h, v, where);
        seen[i] = true;
    }
    for (size_t i = 0; i < ks.size(); ++i)
        if (ks[i].required && !seen[i])
            throw ConfigError("hardware file '" + where + "': missing key '" + ks[i].key + "' (" + ks[i].help + ")");
    return h;
}

Hardware hardware_load(const std::string& name) {
    if (name == "host") {
        Hardware h;
        h.name = "host";
        h.host = true;
        return h;
    }
    if (name == "a100-sxm-80g") return a100();
    if (name == "h100-sxm") return h100();
    if (name == "h200") return h200();
    std::error_code ec;
    if (name.empty() || !std::filesystem::is_regular_file(name, ec))
        throw ConfigError("--hardware = '" + name + "': neither a built-in name (valid: " + names_text() +
                          ") nor a hardware file (docs/planner.md §6)");
    std::ifstream f(name);
    std::stringstream s;
    s << f.rdbuf();
    if (!f) throw ConfigError("--hardware = '" + name + "': cannot read the file");
    return hardware_parse(s.str(), name);
}

std::string hardware_to_text(const Hardware& hw) {
    std::string out = "# quintet hardware description: " + hw.name + "\n", section;
    for (const auto& k : keys()) {
        const std::string s = k.key.substr(0, k.key.find('.'));
        if (s != section) out += "\n[" + s + "]\n", section = s;
        out += "# " + k.help + "\n" + k.key.substr(s.size() + 1) + " = " + k.get(hw) + "\n";
    }
    return out;
}

}  // namespace quintet
