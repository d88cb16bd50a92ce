#pragma once
// A Frontend with a ReferenceEngine on tiny-fortune, serving on its own thread behind a real
// ZeroMQ socket in a private temporary run dir; and the oracle's greedy continuation to compare
// against.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/ipc/client.h"
#include "core/ipc/run_dir.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/model/tokenizer.h"
#include "services/frontend/frontend.h"
#include "services/frontend/reference_engine.h"

namespace duet::frontend::testing {

inline const std::string kModelPath = DUET_SOURCE_DIR "/tests/data/tiny-fortune/fortune-q8_0.gguf";

inline const LlamaModel& tiny_model() {
  static const std::unique_ptr<LlamaModel> m = LlamaModel::load(kModelPath);
  return *m;
}

inline const Tokenizer& tiny_tokenizer() {
  static const Tokenizer t(Vocab::from_gguf(tiny_model().file()));
  return t;
}

// What greedy decoding gives, straight from core ReferenceForward: stops at EOS (not included)
// or after max_tokens.
inline std::vector<int32_t> reference_greedy(const std::vector<int32_t>& prompt, int max_tokens) {
  ReferenceForward f(tiny_model());
  std::vector<float> logits = f.forward(prompt, false);
  std::vector<int32_t> out;
  Sampler greedy(SamplingParams{});
  while (static_cast<int>(out.size()) < max_tokens) {
    const int32_t t = greedy.sample(logits);
    if (t == tiny_tokenizer().eos()) break;
    out.push_back(t);
    if (static_cast<int>(out.size()) == max_tokens) break;
    logits = f.forward(std::vector<int32_t>{t}, false);
  }
  return out;
}

class FrontendTest : public ::testing::Test {
 protected:
  void start(FrontendOptions options = {}, ReferenceEngineOptions engine_options = {}) {
    serve_on_thread([this, options, engine_options](const std::function<void()>& ready) {
      Frontend fe(std::make_unique<ReferenceEngine>(tiny_model(), engine_options), run_dir_,
                  options);
      ready();
      fe.serve(stop_, std::chrono::milliseconds(5));
    });
  }

  // Runs `serve` on thread_ in a fresh private run dir: it builds what serves (its sockets live
  // and die on that thread), calls ready() once bound, then serves until stop_. Returns once
  // ready() was called; rethrows what `serve` threw before that.
  void serve_on_thread(std::function<void(const std::function<void()>& ready)> serve) {
    char tmpl[] = "/tmp/duet-fe-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    run_dir_ = tmpl;
    std::promise<void> ready;
    auto started = ready.get_future();
    thread_ = std::thread([serve, &ready] {
      try {
        serve([&ready] { ready.set_value(); });
      } catch (...) {
        try {
          ready.set_exception(std::current_exception());
        } catch (const std::future_error&) {
          ADD_FAILURE() << "the frontend stopped serving with an exception";
        }
      }
    });
    started.get();
    endpoint_ = ipc_endpoint(client_socket_path(run_dir_));
  }

  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (!run_dir_.empty()) std::filesystem::remove_all(run_dir_);
  }

  std::unique_ptr<client::Client> connect() { return std::make_unique<client::Client>(endpoint_); }

  // Polls the frontend's status until `pred` holds or 5 s pass.
  template <class Pred>
  nlohmann::json wait_status(Pred pred) {
    auto c = connect();
    nlohmann::json s;
    for (int i = 0; i < 500; ++i) {
      s = c->status();
      if (pred(s)) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "status never reached the expected state: " << s.dump();
    return s;
  }

  std::string run_dir_, endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace duet::frontend::testing
