"""The reference side of tests/tokenizer/test_sentencepiece.cpp, with Debian's python3-sentencepiece:
    python3 spm_reference.py CORPUS OUT_DIR
trains three small SentencePiece models (unigram; BPE with byte fallback; and BPE as Llama 2's is
made: byte fallback, no normalization, spaces kept) on CORPUS and a generated text, then writes, for each, OUT_DIR/NAME.model, OUT_DIR/NAME.lines (the ids of each
corpus line) and OUT_DIR/NAME.whole (the ids of the whole corpus). Exit 77 without the module."""
import os
import random
import sys

try:
    import sentencepiece as spm
except ImportError:
    print("SKIPPED: python3-sentencepiece is not installed (Debian: apt-get install python3-sentencepiece)")
    sys.exit(77)

corpus_path, out = sys.argv[1], sys.argv[2]
corpus = open(corpus_path, encoding="utf-8").read()
lines = corpus.split("\n")
if corpus.endswith("\n"):
    lines.pop()

# Training text: the corpus and words drawn from a small random lexicon, so that merges repeat.
rng = random.Random(7)
lexicon = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(800)]
train = [corpus] * 3
for _ in range(3000):
    train.append(" ".join(rng.choice(lexicon) for _ in range(rng.randint(3, 15))) + ".")
train_path = os.path.join(out, "spm_train.txt")
with open(train_path, "w", encoding="utf-8") as f:
    f.write("\n".join(train) + "\n")

llama2 = {"byte_fallback": True, "normalization_rule_name": "identity", "remove_extra_whitespaces": False,
          "split_digits": True}
for name, kind, extra in [("spm_unigram", "unigram", {}), ("spm_bpe", "bpe", {"byte_fallback": True}),
                          ("spm_bpe_llama2", "bpe", llama2)]:
    spm.SentencePieceTrainer.train(input=train_path, model_prefix=os.path.join(out, name), vocab_size=1200,
                                   model_type=kind, character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2, num_threads=1, **extra)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, name + ".model"))
    with open(os.path.join(out, name + ".lines"), "w") as f:
        for line in lines:
            f.write(" ".join(map(str, sp.encode(line))) + "\n")
    with open(os.path.join(out, name + ".whole"), "w") as f:
        f.write(" ".join(map(str, sp.encode(corpus))) + "\n")
print("spm reference: 3 models, %d lines" % len(lines))
