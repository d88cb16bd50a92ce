#pragma once
// What cmd_stack.cpp's verbs use from cmd_stack_config.cpp: the KV plan `up` checks its
// settings against, and `duet stack config`. Kept apart from cmd_stack.cpp, which holds the
// verbs that start and stop a stack.
#include <string>
#include <vector>

#include "core/ipc/stack_models.h"

namespace duet::cli {

// The model `stack up` serves when given none (relative to the repo root, or next to the build).
inline constexpr const char* kDefaultModel = "models/fortune-q8_0.gguf";

// "a,b": repeated flags as one setting value.
std::string joined(const std::vector<std::string>& items);
// --model flags as DUET_MODELS: several, or one NAME=PATH; "" for one plain path (issue 25).
std::string models_flag(const std::vector<std::string>& specs);
// The models `up` serves (the flags' one plain path, else DUET_MODELS, else kDefaultModel), with
// absolute paths that exist (Error not_found naming one that does not); sets DUET_MODELS to
// them for the services, or unsets it for one plain model (the services' --model, as before).
std::vector<ServedModel> resolve_models(const std::vector<std::string>& specs);

// Plans the KV pool the frontend will make (core/model/kv_budget.h) from the stack's settings
// (the flags given, else the DUET_* environment `up` exported) before anything starts; returns
// the line `up` prints about it, or "" for the reference plan. Sets DUET_KV_MEMORY to the budget
// in bytes and DUET_KV_TYPE for the frontend. Error naming why a setting cannot be served.
// Several models (issue 25) divide the one budget (core/model/kv_budget.h plan_kv_pools).
std::string plan_stack_kv(const std::string& stack, const std::vector<ServedModel>& models,
                          const std::string& plan_flag, const std::string& kv_memory_flag,
                          const std::string& kv_type_flag);
// Prints the effective settings of an up stack (<run dir>/settings.json, written by `up`) and
// where each came from; Error(not_found) when the stack is not up.
void print_stack_config(const std::string& run_dir, const std::string& stack, bool json);
// Prints the registry: every key with its variable, type, default and doc (docs/CONFIG.md).
void print_setting_keys();

}  // namespace duet::cli
