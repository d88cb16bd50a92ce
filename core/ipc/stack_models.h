#pragma once
// The models a stack serves (issue 25): `duet stack up --model A --model NAME=B ...`, or the
// config file's `models = "A,NAME=B"` (DUET_MODELS). Each model has a name clients pick it by
// (the client API's `model` field, `--model-name`, HTTP's "model"); the first is the default, the
// one a request naming no model gets. A stack of one model needs no DUET_MODELS: its model is the
// services' --model, named after the file's stem (HTTP's model id, as before).
//
// DUET_MODELS reaches every service through the supervisor's environment as "NAME=ABSPATH,..."
// (stack up resolves the paths), so a restarted or adopted service serves the same list in the
// same order; the order fixes each model's index, which names its KV and journal segments.
#include <string>
#include <string_view>
#include <vector>

namespace duet {

struct ServedModel {
  std::string name;  // [A-Za-z0-9._-], at most 48 characters
  std::string path;  // the GGUF file
};

// "PATH" or "NAME=PATH" (the name defaults to the file's stem: models/fortune-q8_0.gguf ->
// fortune-q8_0). Throws invalid_argument naming the spec when the name is not usable.
ServedModel parse_model_spec(std::string_view spec);
// Several specs: names must differ (invalid_argument naming the repeated one); none: empty.
std::vector<ServedModel> parse_model_specs(const std::vector<std::string>& specs);
// DUET_MODELS's form: comma-separated specs ("" -> none). A path holding ',' cannot be listed.
std::vector<ServedModel> parse_models_setting(std::string_view text);
std::string models_setting(const std::vector<ServedModel>& models);

// The models of this process's stack: DUET_MODELS when set, else the one `default_path` (the
// services' --model; none when that is empty too).
std::vector<ServedModel> stack_models(const std::string& default_path);

// DUET_MODEL_PLANS (issue 25): a plan per model name, "NAME=PLAN,..." (a plan may hold ':' and
// '/', not ','). Every plan is checked as DUET_PLAN is; a name no model has is refused naming it.
// Models not listed run `default_plan`. Returns one plan per model, in the models' order.
std::vector<std::string> model_plans(const std::vector<ServedModel>& models, std::string_view text,
                                     const std::string& default_plan);

// DUET_MODEL_PRIORITIES (issue 25, Puzzle's third chromosome): a rank per model name,
// "NAME=RANK,..." (0 runs first; unlisted models 0). A name no model has, or a rank that is not a
// whole number in [0, 1000], is refused naming it. Returns one rank per model, in their order.
std::vector<int> model_priorities(const std::vector<ServedModel>& models, std::string_view text);

// The model a request names ("" = the first, the default); nullptr when none has that name.
const ServedModel* find_model(const std::vector<ServedModel>& models, std::string_view name);
// "a, b": the names, for error messages.
std::string model_names(const std::vector<ServedModel>& models);
// The error text for a name no model has: it names the model and the served ones ("a, b").
std::string unknown_model_message(std::string_view name, std::string_view served_names);

}  // namespace duet
