// The models a stack serves (core/ipc/stack_models.h, issue 25): `--model PATH` or NAME=PATH,
// DUET_MODELS's list, the default first, names that must differ and be usable in segment names;
// plans and ranks (DUET_MODEL_PLANS, DUET_MODEL_PRIORITIES) by model name.
#include "core/ipc/stack_models.h"

#include <gtest/gtest.h>

#include "core/base/error.h"
#include "tests/support/scoped_env.h"

namespace duet {
namespace {

TEST(StackModels, ANameDefaultsToTheFilesStem) {
  const ServedModel m = parse_model_spec("models/fortune-q8_0.gguf");
  EXPECT_EQ(m.name, "fortune-q8_0");
  EXPECT_EQ(m.path, "models/fortune-q8_0.gguf");
  const ServedModel named = parse_model_spec("small=/m/a=b.gguf");
  EXPECT_EQ(named.name, "small");
  EXPECT_EQ(named.path, "/m/a=b.gguf");  // only the first '=' separates
}

TEST(StackModels, BadOrRepeatedNamesAreRefusedNamingThem) {
  EXPECT_THROW(parse_model_spec("a b=/m/x.gguf"), Error);
  EXPECT_THROW(parse_model_spec("x="), Error);
  EXPECT_THROW(parse_model_spec(std::string(49, 'n') + "=/m/x.gguf"), Error);
  try {
    (void)parse_model_specs({"a=/m/x.gguf", "/n/a.gguf"});
    FAIL() << "two models named 'a'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("two models are named 'a'"), std::string::npos);
  }
}

TEST(StackModels, TheSettingListsThemInOrderAndRoundTrips) {
  const auto models = parse_models_setting("fortune=/m/f.gguf,/m/qwen.gguf,");
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[1].name, "qwen");
  EXPECT_EQ(models_setting(models), "fortune=/m/f.gguf,qwen=/m/qwen.gguf");
  EXPECT_TRUE(parse_models_setting("").empty());
  EXPECT_THROW(models_setting({{"a", "/m/x,y.gguf"}}), Error);
}

TEST(StackModels, AStackIsDuetModelsElseItsOneModel) {
  {
    test_support::ScopedEnv env("DUET_MODELS", "a=/m/a.gguf,b=/m/b.gguf");
    const auto models = stack_models("/m/a.gguf");
    ASSERT_EQ(models.size(), 2u);
    EXPECT_EQ(find_model(models, "")->name, "a");  // no name: the default, the first
    EXPECT_EQ(find_model(models, "b")->path, "/m/b.gguf");
    EXPECT_EQ(find_model(models, "c"), nullptr);
    EXPECT_EQ(unknown_model_message("c", model_names(models)),
              "unknown model 'c': this stack serves a, b");
  }
  test_support::ScopedEnv none("DUET_MODELS", "");
  const auto one = stack_models("/m/my model.v2.gguf");  // any stem: named as before
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].name, "my model.v2");
  EXPECT_TRUE(stack_models("").empty());
}

TEST(StackModels, PlansAndRanksAreGivenPerModelByName) {
  const auto models = parse_models_setting("a=/m/a.gguf,b=/m/b.gguf,c=/m/c.gguf");
  EXPECT_EQ(model_plans(models, "b=gpu-only,", "tensor"),
            (std::vector<std::string>{"tensor", "gpu-only", "tensor"}));
  EXPECT_EQ(model_priorities(models, "c=2,a=1"), (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(model_priorities(models, ""), (std::vector<int>{0, 0, 0})) << "unlisted: rank 0";
  for (const std::string bad : {"d=1", "a", "a=-1", "a=x", "a=1001", "a="}) {
    SCOPED_TRACE(bad);
    try {
      (void)model_priorities(models, bad);
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("model priority '" + bad + "'"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW((void)model_plans(models, "d=gpu-only", "tensor"), Error);
  EXPECT_THROW((void)model_plans(models, "a=nonsense", "tensor"), Error);
}

}  // namespace
}  // namespace duet
