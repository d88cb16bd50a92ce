#include "core/ipc/stack_models.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/base/error.h"
#include "core/base/settings.h"

namespace duet {

namespace {

constexpr size_t kMaxNameChars = 48;  // it becomes part of shm and file names

bool usable_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameChars) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

}  // namespace

ServedModel parse_model_spec(std::string_view spec) {
  ServedModel m;
  const size_t eq = spec.find('=');
  if (eq != std::string_view::npos) {
    m.name = std::string(spec.substr(0, eq));
    m.path = std::string(spec.substr(eq + 1));
  } else {
    m.path = std::string(spec);
    m.name = std::filesystem::path(m.path).stem().string();
  }
  if (m.path.empty())
    throw Error(Errc::invalid_argument, "model '" + std::string(spec) + "': no file given");
  if (!usable_name(m.name))
    throw Error(Errc::invalid_argument,
                "model '" + std::string(spec) + "': the name '" + m.name +
                    "' must be 1-48 letters, digits, '.', '_' or '-' (give NAME=PATH)");
  return m;
}

std::vector<ServedModel> parse_model_specs(const std::vector<std::string>& specs) {
  std::vector<ServedModel> models;
  for (const std::string& s : specs) {
    ServedModel m = parse_model_spec(s);
    if (find_model(models, m.name))
      throw Error(Errc::invalid_argument,
                  "two models are named '" + m.name + "': give one of them another (NAME=PATH)");
    models.push_back(std::move(m));
  }
  return models;
}

std::vector<ServedModel> parse_models_setting(std::string_view text) {
  std::vector<std::string> specs;
  size_t begin = 0;
  while (begin <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    if (end > begin) specs.emplace_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parse_model_specs(specs);
}

std::string models_setting(const std::vector<ServedModel>& models) {
  std::string out;
  for (const ServedModel& m : models) {
    if (m.path.find(',') != std::string::npos)
      throw Error(Errc::invalid_argument,
                  "model file '" + m.path + "': a path holding ',' cannot be served beside others");
    out += (out.empty() ? "" : ",") + m.name + "=" + m.path;
  }
  return out;
}

std::vector<ServedModel> stack_models(const std::string& default_path) {
  if (const auto listed = setting_override("DUET_MODELS")) {
    auto models = parse_models_setting(*listed);
    if (!models.empty()) return models;
  }
  if (default_path.empty()) return {};
  // One model as before: named after its file whatever the stem holds (HTTP's model id).
  return {ServedModel{std::filesystem::path(default_path).stem().string(), default_path}};
}

namespace {

// "NAME=VALUE,..." of DUET_MODEL_PLANS and DUET_MODEL_PRIORITIES: each item's model index and
// value to `take`; an item without '=' or naming no model is refused naming it (`what`: "model
// plan", `form`: "NAME=PLAN (DUET_MODEL_PLANS)").
template <typename Take>
void for_each_model_item(const std::vector<ServedModel>& models, std::string_view text,
                         const std::string& what, const std::string& form, Take take) {
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string_view item = text.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      throw Error(Errc::invalid_argument, what + " '" + std::string(item) + "': give " + form);
    const std::string_view name = item.substr(0, eq), value = item.substr(eq + 1);
    const ServedModel* m = name.empty() ? nullptr : find_model(models, name);
    if (!m)
      throw Error(Errc::invalid_argument, what + " '" + std::string(item) + "': " +
                                              unknown_model_message(name, model_names(models)));
    take(static_cast<size_t>(m - models.data()), value, item);
  }
}

}  // namespace

std::vector<std::string> model_plans(const std::vector<ServedModel>& models, std::string_view text,
                                     const std::string& default_plan) {
  std::vector<std::string> plans(models.size(), default_plan);
  const Setting& plan_setting = *find_setting_env("DUET_PLAN");
  for_each_model_item(models, text, "model plan", "NAME=PLAN (DUET_MODEL_PLANS)",
                      [&](size_t m, std::string_view plan, std::string_view) {
                        check_setting(plan_setting, plan);
                        plans[m] = std::string(plan);
                      });
  return plans;
}

std::vector<int> model_priorities(const std::vector<ServedModel>& models, std::string_view text) {
  std::vector<int> ranks(models.size(), 0);
  for_each_model_item(models, text, "model priority", "NAME=RANK (DUET_MODEL_PRIORITIES)",
                      [&](size_t m, std::string_view rank, std::string_view item) {
                        const bool digits = !rank.empty() && rank.size() <= 4 &&
                                            std::all_of(rank.begin(), rank.end(), [](char c) {
                                              return c >= '0' && c <= '9';
                                            });
                        if (!digits || std::stoi(std::string(rank)) > 1000)
                          throw Error(Errc::invalid_argument,
                                      "model priority '" + std::string(item) +
                                          "': the rank is a whole number in [0, 1000], 0 first "
                                          "(DUET_MODEL_PRIORITIES)");
                        ranks[m] = std::stoi(std::string(rank));
                      });
  return ranks;
}

const ServedModel* find_model(const std::vector<ServedModel>& models, std::string_view name) {
  if (name.empty()) return models.empty() ? nullptr : &models.front();
  for (const ServedModel& m : models)
    if (m.name == name) return &m;
  return nullptr;
}

std::string model_names(const std::vector<ServedModel>& models) {
  std::string out;
  for (const ServedModel& m : models) out += (out.empty() ? "" : ", ") + m.name;
  return out;
}

std::string unknown_model_message(std::string_view name, std::string_view served_names) {
  return "unknown model '" + std::string(name) + "': this stack serves " +
         std::string(served_names);
}

}  // namespace duet
