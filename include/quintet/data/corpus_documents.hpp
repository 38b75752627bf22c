// The documents of `quintet prepare`'s inputs, part by part (docs/data.md, "Documents and the
// end-of-document token"): a JSON line (its text the first --jsonl-key field it has), a
// --split-on piece, or a plain text file as one document in parts of at most 8 MB cut before a
// line that starts with an ASCII letter (where no pre-tokenizer piece crosses). An input is read
// in units of work that depend on the file alone, so any number of ranks gives the same parts.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quintet/data/corpus_input.hpp"
#include "quintet/data/prepare.hpp"

namespace quintet {

// A part of a document: text[begin, end) of `text` (the pre-tokenizer sees all of `text`).
struct Part {
    std::string text;
    size_t begin = 0, end = 0;
    bool first = false, last = false;  // begins / ends its document
    std::vector<uint32_t> ids;
};

// A unit of work: bytes [begin, end) of one input (end -1: to its end); units depend on the file
// alone, never on the number of ranks.
struct Unit {
    size_t file = 0;
    int64_t begin = 0, end = -1;
    bool first = true, last = true;  // the file's first / last unit
};

// What one unit gave: tokens, documents, malformed lines skipped (the first few named).
struct UnitCounts {
    int64_t tokens = 0, documents = 0, bad_lines = 0;
    int64_t bad_before = 0;  // this rank's malformed lines before the unit (the limit is checked on the sum)
    std::vector<std::string> bad_examples;
};

// Thrown by for_each_part when prepare_interrupted() (a stop signal came).
struct PrepareInterrupted {};

// The first place at or after `from` where a unit may begin (a line start; for plain text one
// that begins with an ASCII letter); -1 when none before the end. Plain files only.
int64_t next_boundary(const InputFile& f, int64_t from, bool jsonl);

// Streams the parts of one unit to `emit`, in order; `progress(raw bytes read)` every so often.
// ConfigError naming the file (and line) for bad input; malformed JSON lines are counted in
// `counts` up to job.max_bad_lines.
void for_each_part(const PrepareJob& job, const InputFile& file, const Unit& unit, bool can_cut, UnitCounts& counts,
                   const std::function<void(Part&&)>& emit, const std::function<void(int64_t)>& progress);

}  // namespace quintet
