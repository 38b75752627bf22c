// The deck's [data] section: what a run reads and how it samples it (docs/data.md). It lives
// with the data code so that data/ needs nothing from deck/, which sits above it.
#pragma once
#include <string>

namespace quintet {

struct DataConfig {
    std::string path = "data/quickstart.h5";
    int seq_len = 128;           // T
    int micro_batch_size = 8;    // B
    std::string val_path;        // validation sources (same syntax as path); empty = val_fraction of path
    std::string order = "random";  // random | sequential | shuffle
    double val_fraction = 0.05;
    bool document_mask = false;  // attention stays inside a document (documents end at eos_id)
    int eos_id = -1;             // -1: the token file's eos_id attribute
    bool allow_incomplete = false;  // use a directory without a complete, agreeing manifest as it is
};

}  // namespace quintet
