// The input deck: Boost.Program_options config file (`[section]` + `key = value`) plus
// `--section.key=value` overrides. One option table binds {section.key, field, default, help};
// --help, docs/deck.md and inputs/reference.deck are all generated from it, so they can't drift.
// Every key is checked here, before any work: errors name the key, the value and what is valid.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "quintet/deck/train_config.hpp"

namespace quintet {

struct DeckOption {
    std::string key;      // "section.key"
    std::string help;     // one line
    std::function<void(const std::string&)> set;  // parse + range check; throws ConfigError
    std::function<std::string()> get;             // current value as deck text
};

// The option table, bound to the fields of `deck`.
std::vector<DeckOption> deck_options(Deck& deck);

// Reads DECK_PATH (may be empty: defaults only) and applies `overrides` ("--section.key=value").
// Throws ConfigError on unknown keys, unparsable or out-of-range values.
Deck deck_load(const std::string& deck_path, const std::vector<std::string>& overrides);

// Defaults that follow from another key: parallel.schedule = zbv makes parallel.virtual_stages 2
// unless it was given. deck_load applies it; a command that sets keys itself calls it.
void deck_schedule_defaults(Deck& deck, bool virtual_stages_given);

// Cross-key checks that need the world size (layout) and features not built yet.
// vocab_size must already be set from the data file. check_host_memory: refuse a model whose
// weights and optimizer state cannot fit this machine (the planner plans for other machines).
void deck_validate(const Deck& deck, int world_size, bool check_host_memory = true);

// train.global_batch > 0 fixes the samples per step: sets parallel.microbatches to
// global_batch / (dp x data.micro_batch_size) for this world size where that divides (else
// deck_validate says so). Returns a note when a parallel.microbatches the user gave was replaced,
// else "".
std::string deck_resolve_global_batch(Deck& deck, int world_size);
// The samples per step: train.global_batch, or dp x microbatches x micro_batch_size with dp
// resolved for `world_size`.
int64_t deck_global_batch(const Deck& deck, int world_size);

// The value of `key` as the user wrote it, else as the deck prints it (for messages).
std::string deck_value(const Deck& deck, const std::string& key);

// The keys whose values differ between two decks, in the option table's order.
struct DeckChange {
    std::string key, before, after;
};
std::vector<DeckChange> deck_diff(const Deck& before, const Deck& after);

// The resolved deck as a config file ("[section]" blocks), stored in checkpoints and metrics.
std::string deck_to_text(const Deck& deck);
// Parses deck_to_text's output back (a checkpoint's 'deck' attribute); keys it does not know
// (from another version) are skipped, missing keys keep their defaults.
Deck deck_parse_text(const std::string& text);
// Every key with its default and help as comments: inputs/reference.deck.
std::string deck_reference_text();
// Markdown table of every key: docs/deck.md's body.
std::string deck_markdown_table();

}  // namespace quintet
