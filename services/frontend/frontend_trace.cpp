// Frontend: `duet trace` (issue 23 item 2). One request's steps, as executed through the stack,
// in Chrome's trace-event format (chrome://tracing, ui.perfetto.dev):
//   process 1, measured here: the frontend's lane (the step, its scheduling, table writes,
//     doorbells, the wait on the done flags, the reports, the logits copy, sampling), gpu_svc's
//     and npu_svc's lanes (each op's span, the waits on the other device's flags before it) and
//     an IPC lane per device (doorbell to the device's start, its end to the frontend reading
//     the report);
//   process 2, modelled on the SoC: the same steps' ops as the plan modelled there runs them
//     (core/planner/timeline.h), laid one after another from each measured step's start.
// Everything here runs only when a client asks: the step path only appends to the ring.
#include <algorithm>
#include <chrono>
#include <map>

#include "core/base/error.h"
#include "core/ipc/run_dir.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

namespace fbc = fb::client;

namespace {

constexpr int kMeasuredPid = 1, kModeledPid = 2;
enum Tid : int { kFrontendTid = 1, kGpuTid = 2, kNpuTid = 3, kGpuIpcTid = 4, kNpuIpcTid = 5 };

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

nlohmann::json meta(const char* what, int pid, int tid, const std::string& name) {
  nlohmann::json e = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", {{"name", name}}}};
  if (tid) e["tid"] = tid;
  return e;
}

// A device ring's steps (services/device/step_trace.h) by (program, seq). Several entries of
// one key are possible (a re-run after a device restart, or an engine rebuilt since): the
// caller picks the one inside the frontend step's window.
using DeviceSteps = std::multimap<std::pair<uint32_t, uint64_t>, nlohmann::json>;

DeviceSteps ask_device(const std::string& run_dir, ServiceId id,
                       const std::vector<uint32_t>& programs, uint64_t first, uint64_t last,
                       std::vector<std::string>& notes) {
  DeviceSteps out;
  if (programs.empty()) return out;
  const char* name = id == ServiceId::gpu ? "gpu_svc" : "npu_svc";
  try {
    msg::RequestClient client(ipc_endpoint(control_socket_path(run_dir, id)));
    const msg::Reply reply = client.call(
        [&](uint64_t rid) {
          flatbuffers::FlatBufferBuilder fbb;
          auto body = fb::CreateTraceRequestDirect(fbb, &programs, first, last);
          return msg::finish_message(fbb, rid, body);
        },
        std::chrono::milliseconds(2000));
    const auto* r = reply.message().body_as_TraceReply();
    if (!r || !r->json()) throw Error(Errc::bad_format, "not a TraceReply");
    const nlohmann::json j = nlohmann::json::parse(r->json()->str());
    for (const nlohmann::json& s : j.at("steps"))
      out.emplace(std::make_pair(s.at("program_id").get<uint32_t>(), s.at("seq").get<uint64_t>()),
                  s);
  } catch (const std::exception& e) {
    notes.push_back(std::string(name) + "'s op spans are missing: " + e.what());
  }
  return out;
}

const nlohmann::json* pick(const DeviceSteps& steps, uint32_t program, uint64_t seq, int64_t lo,
                           int64_t hi) {
  auto [a, b] = steps.equal_range({program, seq});
  for (auto it = a; it != b; ++it) {
    const int64_t start = it->second.at("start_ns").get<int64_t>();
    if (start >= lo && start <= hi) return &it->second;
  }
  return nullptr;
}

}  // namespace

void Frontend::record_step(std::vector<uint64_t> request_numbers, const StepStats& stats) {
  StepRecord r;
  r.number = metrics_.steps;
  r.requests = std::move(request_numbers);
  r.detail = stats.detail;
  r.modeled_us = stats.modeled_us;
  r.end_ns = steady_now_ns();
  // The pass's start, unless the step began before it (an overlapped step collected later).
  r.begin_ns =
      stats.detail.begin_ns > 0 ? std::min(pass_begin_ns_, stats.detail.begin_ns) : pass_begin_ns_;
  step_ring_.record(std::move(r));
}

nlohmann::json Frontend::trace_status() const {
  uint64_t first = 0, last = 0;
  for (const StepRecord& s : step_ring_.steps())
    for (uint64_t n : s.requests) {
      first = first ? std::min(first, n) : n;
      last = std::max(last, n);
    }
  return {{"steps_kept", step_ring_.steps().size()},
          {"capacity", step_ring_.capacity()},
          {"requests_numbered", requests_numbered_},
          {"first_request_kept", first},
          {"last_request_kept", last}};
}

void Frontend::on_trace(const std::vector<std::string>& routing, uint64_t id, const fbc::Trace& t) {
  const nlohmann::json j = build_trace(t.request());
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateTraceReplyDirect(fbb, j.dump().c_str());
  fbb.Finish(fbc::CreateClientMessage(fbb, id, fbc::ClientBody::TraceReply, body.Union()),
             fbc::ClientMessageIdentifier());
  (void)send_to(routing, std::span<const uint8_t>(fbb.GetBufferPointer(), fbb.GetSize()));
}

nlohmann::json Frontend::build_trace(uint64_t number) const {
  if (!step_ring_.enabled())
    throw Error(Errc::unsupported, "this frontend keeps no steps (DUET_TRACE_STEPS=0)");
  if (number == 0)
    for (const StepRecord& s : step_ring_.steps())
      for (uint64_t n : s.requests) number = std::max(number, n);
  std::vector<const StepRecord*> steps;
  for (const StepRecord& s : step_ring_.steps())
    if (std::find(s.requests.begin(), s.requests.end(), number) != s.requests.end())
      steps.push_back(&s);
  if (steps.empty()) {
    const nlohmann::json st = trace_status();
    throw Error(Errc::not_found, number == 0
                                     ? std::string("no request has steps in the ring yet")
                                     : "request " + std::to_string(number) +
                                           " has no steps in the ring (it holds the last " +
                                           std::to_string(step_ring_.capacity()) +
                                           " steps: requests " + st["first_request_kept"].dump() +
                                           " to " + st["last_request_kept"].dump() + ")");
  }

  // What the engines say of each step (op names, the modelled timeline), and the seq range to
  // ask the devices for.
  std::vector<const Engine*> engines = {engine_.get(), proactive_engine_.get()};
  for (const auto& [plan, e] : plan_engines_) engines.push_back(e.get());
  std::vector<nlohmann::json> infos;
  std::vector<uint32_t> gpu_programs, npu_programs;
  uint64_t first_seq = UINT64_MAX, last_seq = 0;
  std::vector<std::string> notes;
  for (const StepRecord* s : steps) {
    nlohmann::json info;
    // (Not the proactive engine while its step runs on a worker: that thread owns it.)
    for (const Engine* e : engines)
      if (e && !(e == proactive_engine_.get() && async_.running()) && info.empty() &&
          s->detail.engine != 0)
        info = e->trace_step(s->detail);
    if (info.empty())
      notes.push_back("step " + std::to_string(s->number) +
                      ": its engine no longer has the programs it ran (rebuilt since, or not a "
                      "program engine): frontend spans only");
    infos.push_back(info);
    if (s->detail.on_gpu) gpu_programs.push_back(s->detail.gpu_program);
    if (s->detail.on_npu) npu_programs.push_back(s->detail.npu_program);
    first_seq = std::min(first_seq, s->detail.seq);
    last_seq = std::max(last_seq, s->detail.seq);
  }
  for (auto* v : {&gpu_programs, &npu_programs}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  const DeviceSteps gpu_steps =
      ask_device(run_dir_, ServiceId::gpu, gpu_programs, first_seq, last_seq, notes);
  const DeviceSteps npu_steps =
      ask_device(run_dir_, ServiceId::npu, npu_programs, first_seq, last_seq, notes);

  const int64_t t0 = steps.front()->begin_ns;
  auto ts = [t0](int64_t ns) { return static_cast<double>(ns - t0) / 1000.0; };
  nlohmann::json events = nlohmann::json::array();
  auto span = [&](int pid, int tid, const std::string& name, const char* cat, double start_us,
                  double end_us, nlohmann::json args) {
    events.push_back({{"name", name},
                      {"cat", cat},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", tid},
                      {"ts", start_us},
                      {"dur", std::max(0.0, end_us - start_us)},
                      {"args", std::move(args)}});
  };
  const std::string executed = engine_->executed_plan(), modeled = engine_->modeled_plan();
  std::string soc;
  events.push_back(meta("process_name", kMeasuredPid, 0, "measured here: " + executed));
  events.push_back({{"ph", "M"},
                    {"name", "process_sort_index"},
                    {"pid", kMeasuredPid},
                    {"args", {{"sort_index", 1}}}});
  events.push_back(meta("thread_name", kMeasuredPid, kFrontendTid, "frontend"));
  events.push_back(meta("thread_name", kMeasuredPid, kGpuTid, "gpu_svc"));
  events.push_back(meta("thread_name", kMeasuredPid, kNpuTid, "npu_svc"));
  events.push_back(meta("thread_name", kMeasuredPid, kGpuIpcTid, "ipc frontend <-> gpu_svc"));
  events.push_back(meta("thread_name", kMeasuredPid, kNpuIpcTid, "ipc frontend <-> npu_svc"));

  double modeled_end_us = 0;  // the modelled steps are laid one after another
  size_t op_spans = 0, modeled_ops = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    const StepRecord& s = *steps[k];
    const StepDetail& d = s.detail;
    const nlohmann::json& info = infos[k];
    nlohmann::json step_args = {{"step", s.number},
                                {"seq", d.seq},
                                {"requests", s.requests},
                                {"tokens", d.n_tokens},
                                {"sequences", d.n_seqs},
                                {"context", d.context},
                                {"bucket_tokens", d.bucket_tokens},
                                {"measured_us", static_cast<double>(s.end_ns - s.begin_ns) / 1000},
                                {"modeled_us", s.modeled_us}};
    if (!info.empty()) {
      step_args["plan"] = info["plan"];
      // Which placement it ran: prefill or decode (a plan per phase), any (one placement).
      step_args["phase"] = info["phase"];
      step_args["gpu_ops"] = d.on_gpu ? info["gpu_ops"].size() : 0;
      step_args["npu_ops"] = d.on_npu ? info["npu_ops"].size() : 0;
    }
    const std::string step_name = "step " + std::to_string(s.number);
    span(kMeasuredPid, kFrontendTid, step_name, "step", ts(s.begin_ns), ts(s.end_ns), step_args);
    if (d.begin_ns > 0) {
      const std::pair<const char*, std::pair<int64_t, int64_t>> phases[] = {
          {"schedule", {s.begin_ns, d.begin_ns}},
          {"prepare tables", {d.begin_ns, d.prepared_ns}},
          {"ring doorbells", {d.prepared_ns, d.rung_ns}},
          {"wait done flags", {d.rung_ns, d.flags_ns}},
          {"read reports", {d.flags_ns, d.reports_ns}},
          {"copy logits", {d.reports_ns, d.end_ns}},
          {"sample + stream", {d.end_ns, s.end_ns}}};
      for (const auto& [name, range] : phases)
        if (range.first > 0 && range.second > range.first)
          span(kMeasuredPid, kFrontendTid, name, "frontend", ts(range.first), ts(range.second),
               {{"step", s.number}});
    }
    // The devices' lanes.
    for (const bool gpu : {true, false}) {
      if (gpu ? !d.on_gpu : !d.on_npu) continue;
      const nlohmann::json* dev =
          pick(gpu ? gpu_steps : npu_steps, gpu ? d.gpu_program : d.npu_program, d.seq,
               d.prepared_ns ? d.prepared_ns : s.begin_ns, s.end_ns);
      const char* device = gpu ? "gpu_svc" : "npu_svc";
      if (!dev) {
        notes.push_back("step " + std::to_string(s.number) + ": " + device +
                        "'s ring no longer holds it");
        continue;
      }
      const int tid = gpu ? kGpuTid : kNpuTid;
      const int64_t dev_start = dev->at("start_ns"), dev_end = dev->at("end_ns");
      span(kMeasuredPid, tid, step_name, "step", ts(dev_start), ts(dev_end),
           {{"step", s.number}, {"seq", d.seq}, {"wait_us", dev->at("wait_us")}});
      const nlohmann::json& names =
          info.empty() ? nlohmann::json::array() : info[gpu ? "gpu_ops" : "npu_ops"];
      int64_t prev_end = dev_start;
      for (const nlohmann::json& op : dev->at("ops")) {
        const uint32_t index = op[0];
        int64_t start = op[1], end = op[2];
        if (start <= 0) start = end = prev_end;  // no timestamps from the runtime
        start = std::clamp(start, dev_start, dev_end);
        end = std::clamp(end, start, dev_end);
        const double wait_us = op[5];
        if (wait_us > 0.5) {
          const int64_t wait_from =
              std::max(prev_end, start - static_cast<int64_t>(wait_us * 1000.0));
          if (start > wait_from)
            span(kMeasuredPid, tid, gpu ? "wait npu flags" : "wait gpu flags", "flag_wait",
                 ts(wait_from), ts(start), {{"step", s.number}, {"wait_us", wait_us}});
        }
        const std::string name =
            index < names.size() ? names[index].get<std::string>() : "op " + std::to_string(index);
        span(kMeasuredPid, tid, name, "op", ts(start), ts(end),
             {{"step", s.number},
              {"op", index},
              {"measured_us", op[3]},
              {"modeled_us", op[4]},
              {"wait_us", wait_us}});
        ++op_spans;
        prev_end = end;
      }
      const int ipc = gpu ? kGpuIpcTid : kNpuIpcTid;
      if (d.prepared_ns > 0 && dev_start > d.prepared_ns)
        span(kMeasuredPid, ipc, std::string("doorbell -> ") + device, "ipc", ts(d.prepared_ns),
             ts(dev_start), {{"step", s.number}});
      if (d.reports_ns > dev_end)
        span(kMeasuredPid, ipc, std::string(device) + " report -> frontend", "ipc", ts(dev_end),
             ts(d.reports_ns), {{"step", s.number}});
    }
    // The modelled SoC timeline of the same step.
    if (info.contains("modeled")) {
      const nlohmann::json& m = info["modeled"];
      soc = m.value("soc", "");
      const double base = std::max(ts(d.prepared_ns ? d.prepared_ns : s.begin_ns), modeled_end_us);
      const double step_us = m.value("step_us", 0.0);
      for (const auto& [lane, tid] : {std::pair{"gpu", 1}, std::pair{"npu", 2}}) {
        if (m[lane].empty()) continue;
        span(kModeledPid, tid, step_name, "step", base, base + step_us,
             {{"step", s.number}, {"modeled_us", step_us}, {"plan", m["plan"]}});
        for (const nlohmann::json& op : m[lane]) {
          span(kModeledPid, tid, op["name"].get<std::string>(), "op",
               base + op["start_us"].get<double>(), base + op["end_us"].get<double>(),
               {{"step", s.number},
                {"layer", op["layer"]},
                {"tokens", op["tokens"]},
                {"waited_cross", op["waited_cross"]}});
          ++modeled_ops;
        }
      }
      modeled_end_us = base + step_us;
    }
  }
  events.push_back(
      meta("process_name", kModeledPid, 0,
           "modelled on " + (soc.empty() ? std::string("the SoC") : soc) + ": " + modeled));
  events.push_back({{"ph", "M"},
                    {"name", "process_sort_index"},
                    {"pid", kModeledPid},
                    {"args", {{"sort_index", 2}}}});
  events.push_back(meta("thread_name", kModeledPid, 1, "GPU (modelled)"));
  events.push_back(meta("thread_name", kModeledPid, 2, "NPU (modelled)"));
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"request", number},
            {"model", options_.model_name},
            {"steps", steps.size()},
            {"op_spans", op_spans},
            {"modeled_ops", modeled_ops},
            {"executed_plan", executed},
            {"modeled_plan", modeled},
            {"soc", soc},
            {"clock", "steady clock of this host, us from the request's first step"},
            {"notes", notes}}}};
}

}  // namespace duet::frontend
