#include "services/gpu_svc/queue_picker.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string>

#include "core/base/error.h"
#include "core/base/settings.h"

namespace duet::gpu {

QueuePicker::Options QueuePicker::from_env() {
  Options o;
  // The registry (core/base/settings.cpp) checks both and holds their defaults.
  const std::string mode = setting_text("DUET_GPU_NARROW");
  o.mode = mode == "auto" ? Mode::measure : mode == "off" ? Mode::off : Mode::on;
  o.max_tokens = static_cast<uint32_t>(setting_int("DUET_GPU_NARROW_MAX_TOKENS"));
  return o;
}

double QueuePicker::Arm::estimate() const {
  if (n == 0) return std::numeric_limits<double>::infinity();
  if (n == 1) return last[0];
  if (n == 2) return (last[0] + last[1]) / 2;
  const double a = last[0], b = last[1], c = last[2];
  return std::max(std::min(a, b), std::min(std::max(a, b), c));  // the median of three
}

uint32_t QueuePicker::context_bucket(uint32_t context) {
  return static_cast<uint32_t>(std::bit_width(context / 64));
}

double QueuePicker::loser_over_winner(const Shape& s) {
  const double w = s.arm[0].estimate(), nr = s.arm[1].estimate();
  const double win = std::min(w, nr), lose = std::max(w, nr);
  return win > 0 ? lose / win : 1.0;
}

std::optional<QueuePicker::Carried> QueuePicker::carried_over(uint32_t program, uint32_t n_tokens,
                                                              uint32_t context_bucket) const {
  // Nearest measured bucket below (wide there means wide here) and above (narrow there means
  // narrow here); the map is ordered by (program, tokens, bucket).
  const auto here = shapes_.lower_bound(Key{program, n_tokens, context_bucket});
  for (auto it = std::make_reverse_iterator(here); it != shapes_.rend(); ++it) {
    if (it->first.program != program || it->first.n_tokens != n_tokens) break;
    if (measured(it->second)) {
      if (faster(it->second) == StepQueue::wide)
        return Carried{StepQueue::wide, loser_over_winner(it->second)};
      break;
    }
  }
  for (auto it = shapes_.upper_bound(Key{program, n_tokens, context_bucket}); it != shapes_.end();
       ++it) {
    if (it->first.program != program || it->first.n_tokens != n_tokens) break;
    if (measured(it->second)) {
      if (faster(it->second) == StepQueue::narrow)
        return Carried{StepQueue::narrow, loser_over_winner(it->second)};
      break;
    }
  }
  return std::nullopt;
}

StepQueue QueuePicker::keep(Shape& s, StepQueue best, double ratio) {
  ++s.picks;
  if (o_.reprobe_every == 0) return best;
  // Re-measuring ~0.5% of the time, clamped as a double: a huge ratio never reaches the cast.
  const auto least = static_cast<double>(o_.reprobe_every);
  const auto interval =
      static_cast<uint64_t>(std::clamp(std::ceil(200.0 * (ratio - 1.0)), least, 16 * least));
  if (s.picks % interval == 0) return best == StepQueue::wide ? StepQueue::narrow : StepQueue::wide;
  return best;
}

StepQueue QueuePicker::pick(uint32_t program, uint32_t n_tokens, uint32_t context) {
  if (o_.mode == Mode::off || n_tokens > o_.max_tokens) return StepQueue::wide;
  if (o_.mode == Mode::on) return StepQueue::narrow;
  Shape& s = shape(program, n_tokens, context);
  const Arm& w = s.arm[0];
  const Arm& nr = s.arm[1];
  if (measured(s)) return keep(s, faster(s), loser_over_winner(s));
  if (const auto carried = carried_over(program, n_tokens, context_bucket(context)))
    return keep(s, carried->queue, carried->loser_over_winner);
  return nr.n < w.n ? StepQueue::narrow : StepQueue::wide;  // alternate while measuring
}

void QueuePicker::observe(uint32_t program, uint32_t n_tokens, uint32_t context, StepQueue q,
                          double us) {
  if (o_.mode != Mode::measure || n_tokens > o_.max_tokens) return;
  Arm& a = shape(program, n_tokens, context).arm[static_cast<int>(q)];
  a.last[static_cast<size_t>(a.n % 3)] = us;
  ++a.n;
}

nlohmann::json QueuePicker::to_json() const {
  nlohmann::json shapes = nlohmann::json::array();
  for (const auto& [key, s] : shapes_) {
    auto ms = [](const Arm& a) {
      return a.n ? nlohmann::json(a.estimate() / 1000.0) : nlohmann::json(nullptr);
    };
    // The bucket's context range: [64 * 2^(b-1), 64 * 2^b), from 0 for bucket 0.
    const uint32_t from = key.context_bucket == 0 ? 0 : 64u << (key.context_bucket - 1);
    shapes.push_back({{"program", key.program},
                      {"tokens", key.n_tokens},
                      {"context_from", from},
                      {"wide_steps", s.arm[0].n},
                      {"narrow_steps", s.arm[1].n},
                      {"wide_ms", ms(s.arm[0])},
                      {"narrow_ms", ms(s.arm[1])}});
  }
  const char* mode = o_.mode == Mode::off ? "off" : o_.mode == Mode::on ? "on" : "auto";
  return {{"mode", mode}, {"max_tokens", o_.max_tokens}, {"shapes", shapes}};
}

}  // namespace duet::gpu
