// The documents of prepare's inputs (corpus_documents.hpp): JSON lines, --split-on pieces, or a
// plain text file in parts cut where the tokenizer allows.
#include "quintet/data/corpus_documents.hpp"

#include <algorithm>

#include "quintet/core/error.hpp"

namespace quintet {

namespace {

[[noreturn]] void bad_input(const std::string& what) { throw ConfigError("prepare: " + what); }

constexpr size_t kBlock = size_t(8) << 20;  // bytes of text per part of a long document

// Reads a plain file's lines, knowing where the next one starts.
class LineReader {
public:
    explicit LineReader(ByteStream& in) : in_(in) {}
    bool line(std::string& out) {
        out.clear();
        for (;;) {
            const size_t nl = buf_.find('\n', at_);
            if (nl != std::string::npos) {
                out.append(buf_, at_, nl - at_);
                at_ = nl + 1;
                return true;
            }
            out.append(buf_, at_, std::string::npos);
            buf_.clear();
            at_ = 0;
            if (in_.read(buf_, size_t(1) << 20) == 0) return !out.empty();
        }
    }
    int64_t tell() const { return in_.tell() - int64_t(buf_.size() - at_); }

private:
    ByteStream& in_;
    std::string buf_;
    size_t at_ = 0;
};

// The last place in s[from, size) where a part may end: before a line starting with an ASCII
// letter (tokenizer_cut's rule); 0 when none.
size_t last_cut(const std::string& s, size_t from) {
    for (size_t p = s.size(); p > from + 1; --p) {
        const unsigned char c = static_cast<unsigned char>(s[p - 1]);
        if (s[p - 2] == '\n' && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) return p - 1;
    }
    return 0;
}

}  // namespace

int64_t next_boundary(const InputFile& f, int64_t from, bool jsonl) {
    auto in = ByteStream::open(f);
    in->seek(from - 1);
    std::string buf;
    int64_t base = from - 1;
    while (in->read(buf, 1 << 16) > 0) {
        for (size_t i = 1; i < buf.size(); ++i) {
            const unsigned char c = static_cast<unsigned char>(buf[i]);
            if (buf[i - 1] == '\n' && (jsonl || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'))) return base + int64_t(i);
        }
        base += int64_t(buf.size()) - 1;
        buf.erase(0, buf.size() - 1);
    }
    return -1;
}

namespace {

int64_t lines_before(const InputFile& f, int64_t at) {
    auto in = ByteStream::open(f);
    std::string buf;
    int64_t n = 0, seen = 0;
    while (seen < at && in->read(buf, size_t(std::min<int64_t>(1 << 20, at - seen))) > 0) {
        n += std::count(buf.begin(), buf.end(), '\n');
        seen += int64_t(buf.size());
        buf.clear();
    }
    return n;
}

}  // namespace

void for_each_part(const PrepareJob& job, const InputFile& file, const Unit& unit, bool can_cut, UnitCounts& counts,
                   const std::function<void(Part&&)>& emit, const std::function<void(int64_t)>& progress) {
    auto in_ptr = ByteStream::open(file);
    ByteStream& in = *in_ptr;
    if (unit.begin > 0) in.seek(unit.begin);
    if (file.format == InputFormat::jsonl) {
        LineReader lines(in);
        std::string line, text, why;
        auto line_no = [&](int64_t n) { return std::to_string(n + (unit.begin > 0 ? lines_before(file, unit.begin) : 0)); };
        for (int64_t n = 1; (unit.end < 0 || lines.tell() < unit.end) && lines.line(line); ++n) {
            if (prepare_interrupted()) throw PrepareInterrupted{};
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
            if (!job.keys.text_of(line, text, why)) {
                const std::string where = "input '" + file.path + "' line " + line_no(n) + ": " + why;
                if (counts.bad_before + counts.bad_lines >= job.max_bad_lines)
                    bad_input(where + (job.max_bad_lines > 0 ? " (more than --max-bad-lines = " +
                                                                   std::to_string(job.max_bad_lines) + " malformed lines)"
                                                             : " (--max-bad-lines N skips up to N such lines)"));
                ++counts.bad_lines;
                if (counts.bad_examples.size() < 5) counts.bad_examples.push_back(where);
                continue;
            }
            if (text.empty()) continue;
            Part p;
            p.text = std::move(text);
            p.end = p.text.size();
            p.first = p.last = true;
            emit(std::move(p));
            if ((n & 1023) == 0) progress(in.raw_offset());
        }
        progress(in.raw_offset());
        return;
    }
    std::string buf;
    if (!job.sep.empty()) {
        // Documents between separators, each whole (empty ones dropped).
        auto doc = [&](std::string text) {
            if (text.empty()) return;
            Part p;
            p.text = std::move(text);
            p.end = p.text.size();
            p.first = p.last = true;
            emit(std::move(p));
        };
        for (bool more = true; more;) {
            if (prepare_interrupted()) throw PrepareInterrupted{};
            more = in.read(buf, kBlock) > 0;
            progress(in.raw_offset());
            size_t at = 0;
            for (size_t next; (next = buf.find(job.sep, at)) != std::string::npos; at = next + job.sep.size())
                doc(buf.substr(at, next - at));
            buf.erase(0, at);
        }
        doc(std::move(buf));
        return;
    }
    // The whole file is one document, in parts cut where the tokenizer allows.
    bool doc_open = !unit.first;  // the document's first part was emitted
    auto left = [&] { return unit.end < 0 ? int64_t(kBlock) : std::min<int64_t>(int64_t(kBlock), unit.end - in.tell()); };
    for (bool more = true; more;) {
        if (prepare_interrupted()) throw PrepareInterrupted{};
        const int64_t n = left();
        more = n > 0 && in.read(buf, size_t(n)) > 0;
        progress(in.raw_offset());
        if (!more || !can_cut || buf.size() < kBlock) continue;
        const size_t cut = last_cut(buf, 0);
        if (cut == 0) continue;
        Part p;
        p.text = buf;  // the pre-tokenizer sees past the cut
        p.end = cut;
        p.first = !doc_open;
        doc_open = true;
        emit(std::move(p));
        buf.erase(0, cut);
    }
    if (buf.empty() && !doc_open) return;  // an empty file: no document
    if (!unit.last) {
        // A unit that ends inside the document: its last part sees a little of the next unit.
        Part p;
        p.end = buf.size();
        p.text = std::move(buf);
        std::string after;
        in.seek(unit.end);
        in.read(after, 4096);
        p.text += after;
        p.first = !doc_open;
        emit(std::move(p));
        return;
    }
    Part p;  // the rest, or an empty part that closes the document (its eos)
    p.end = buf.size();
    p.text = std::move(buf);
    p.first = !doc_open;
    p.last = true;
    emit(std::move(p));
}

}  // namespace quintet
