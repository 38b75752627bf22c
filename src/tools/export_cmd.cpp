// `quintet export --checkpoint CKPT --format gguf|hf --output PATH [--dtype ...] [--force]` and
// `quintet import --format hf --input DIR --output CKPT.h5`: a checkpoint to the formats other
// runtimes read, and a Hugging Face model to a checkpoint (docs/interop.md). One process (rank 0).
// Every option is checked, and the checkpoint read, before anything is written.
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>

#include "quintet/core/error.hpp"
#include "quintet/interop/gguf.hpp"
#include "quintet/interop/hf.hpp"
#include "quintet/interop/output_path.hpp"
#include "quintet/interop/weights.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/tokenizer/tokenizer_spec.hpp"
#include "quintet/tools/commands.hpp"

namespace po = boost::program_options;

namespace quintet {

int export_main(int argc, char** argv) {
    std::string ckpt, format, output, dtype, data;
    double shard_mb = 4096;
    po::options_description desc(
        "usage: quintet export --checkpoint CKPT.h5 --format gguf|hf --output PATH [options]\n\n"
        "Writes a checkpoint's model for other runtimes, tokenizer included: gguf = one GGUF file\n"
        "for llama.cpp (architecture llama for model.attention = mha, deepseek2 for mla); hf = a\n"
        "Hugging Face directory (safetensors, config.json, tokenizer). Mappings: docs/interop.md.\n\noptions");
    desc.add_options()("help,h", "this text")("checkpoint", po::value(&ckpt), "checkpoint file (step_*.h5), or a run folder / its checkpoints/ folder / latest (the checkpoint latest names)")(
        "format", po::value(&format), "gguf | hf")("output", po::value(&output),
                                                  "the GGUF file (gguf) or the directory (hf) to write")(
        "dtype", po::value(&dtype)->default_value("f32"), "matrices as f32 | f16 | bf16 (hf: f32 | bf16)")(
        "force", "replace an existing output")(
        "max-shard-mb", po::value(&shard_mb)->default_value(4096, "4096"),
        "hf: safetensors shards of at most this many MiB (model-0000i-of-0000n.safetensors and the index)")(
        "data", po::value(&data),
        "a checkpoint without a tokenizer (older than the /tokenizer group): the token file whose tokenizer "
        "it was trained with");
    po::variables_map vm;
    try {
        po::store(po::parse_command_line(argc, argv, desc), vm);
        po::notify(vm);
    } catch (const po::error& e) {
        throw ConfigError(std::string("export: ") + e.what() + " (see quintet export --help)");
    }
    if (vm.count("help")) {
        std::cout << desc << "\n";
        return 0;
    }
    if (ckpt.empty()) throw ConfigError("export: --checkpoint is required (see quintet export --help)");
    if (format != "gguf" && format != "hf")
        throw ConfigError("export: --format = '" + format + "': valid: gguf | hf");
    const bool gguf = format == "gguf";
    if (gguf ? (dtype != "f32" && dtype != "f16" && dtype != "bf16") : (dtype != "f32" && dtype != "bf16"))
        throw ConfigError("export: --dtype = '" + dtype + "': valid for --format " + format + ": " +
                          (gguf ? "f32 | f16 | bf16" : "f32 | bf16"));
    if (!(shard_mb > 0)) throw ConfigError("export: --max-shard-mb = " + std::to_string(shard_mb) + ": must be > 0");
    const bool force = vm.count("force") > 0;
    // Where it goes, before any work: an earlier export of quintet's is the only thing --force
    // replaces (interop/output_path.hpp).
    const OutputTarget target =
        gguf ? output_check(output, OutputKind::file, force, "export: --output", "a file such as model.gguf",
                            gguf_export_recognise)
             : output_check(output, OutputKind::directory, force, "export: --output", "a directory such as hf_model/",
                            hf_export_recognise);

    {  // a run folder, its checkpoints/ folder or `latest`: the checkpoint `latest` names
        std::string note;
        ckpt = checkpoint_resolve(ckpt, "export: --checkpoint", &note);
        if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
    }
    const CheckpointMeta meta = checkpoint_read_meta(ckpt);
    Tokenizer tok;
    if (!meta.tokenizer.empty()) {
        tok = tokenizer_from_state(meta.tokenizer, "checkpoint '" + ckpt + "': /tokenizer");
        if (!data.empty())
            if (const std::string why = tokenizer_change(meta, token_file_read_tokenizer(data)); !why.empty())
                throw ConfigError("export: --data '" + data + "': " + why);
    } else if (!data.empty()) {
        tok = token_file_read_tokenizer(data);
    } else {
        throw ConfigError("export: checkpoint '" + ckpt +
                          "' has no tokenizer (it is older than the /tokenizer group); give --data FILE, the token "
                          "file it was trained on, to attach that file's tokenizer");
    }
    const ExportModel model = export_model_read(ckpt, tok);
    if (gguf) {
        gguf_export(model, target.path.string(), dtype);
    } else {
        hf_export(model, target, dtype, uint64_t(shard_mb * 1048576.0));
    }
    std::fprintf(stderr, "export: wrote %s (%s, %s, %zu tensors from %s)\n", output.c_str(), format.c_str(),
                 dtype.c_str(), model.tensors.size(), ckpt.c_str());
    return 0;
}

int import_main(int argc, char** argv) {
    std::string format, input, output;
    po::options_description desc(
        "usage: quintet import --format hf --input DIR --output CKPT.h5 [--force]\n\n"
        "A Hugging Face Llama or DeepSeek-V2/V3 directory (config.json, safetensors, tokenizer.json or\n"
        "tokenizer.model) as a step-0 quintet checkpoint with its deck and tokenizer, for\n"
        "checkpoint.init_from (continued pretraining, context extension). docs/interop.md.\n\noptions");
    desc.add_options()("help,h", "this text")("format", po::value(&format), "hf")(
        "input", po::value(&input), "the Hugging Face model directory")(
        "output", po::value(&output), "the checkpoint file to write")("force", "replace an existing output");
    po::variables_map vm;
    try {
        po::store(po::parse_command_line(argc, argv, desc), vm);
        po::notify(vm);
    } catch (const po::error& e) {
        throw ConfigError(std::string("import: ") + e.what() + " (see quintet import --help)");
    }
    if (vm.count("help")) {
        std::cout << desc << "\n";
        return 0;
    }
    if (format != "hf") throw ConfigError("import: --format = '" + format + "': valid: hf");
    if (input.empty()) throw ConfigError("import: --input is required (a Hugging Face model directory)");
    const OutputTarget target = output_check(output, OutputKind::file, vm.count("force") > 0, "import: --output",
                                             "a checkpoint file such as model.h5", import_output_recognise);
    hf_import(input, target.path.string());
    std::fprintf(stderr, "import: wrote %s from %s\n", output.c_str(), input.c_str());
    return 0;
}

}  // namespace quintet
