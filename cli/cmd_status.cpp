// duet status --stack ID [--json]: the stack as a user sees it: the supervisor's view of the
// services (pid, restarts, health), the device services' own (gpu_svc's OpenCL device, copies,
// KV uploaded, narrow queue; npu_svc's NPU) and the frontend's queue, running requests, limits and
// metrics (TTFT, TPOT, tokens/s, queue time, flag wait, KV bytes copied, restarts; measured and
// modelled). A part that does not answer is reported as an error, not hidden.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "core/ipc/client.h"
#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"

namespace {

struct StatusArgs {
  std::string stack = "default";
  std::string run_dir;
  bool json = false;
  int timeout_ms = 3000;
};

// A StatusRequest over a control socket: the reply's JSON, or {"error": why}.
nlohmann::json query_status(const std::string& sock, const std::string& who,
                            const std::string& if_missing, int timeout_ms) {
  if (!std::filesystem::exists(sock))
    return {{"error", "no " + who + " socket " + sock + if_missing}};
  try {
    duet::msg::RequestClient c(duet::ipc_endpoint(sock));
    auto reply = c.call([](uint64_t id) { return duet::msg::make_status_request(id); },
                        std::chrono::milliseconds(timeout_ms));
    const auto* s = reply.message().body_as_StatusReply();
    if (!s || !s->json()) return {{"error", "the " + who + " answered with something else"}};
    return nlohmann::json::parse(s->json()->str());
  } catch (const std::exception& e) {
    return {{"error", e.what()}};
  }
}

nlohmann::json supervisor_status(const std::string& run_dir, int timeout_ms) {
  return query_status(duet::supervisor_socket_path(run_dir), "supervisor",
                      " (the stack is not up, or runs unsupervised)", timeout_ms);
}

// The device services' own status: gpu_svc's OpenCL device, copies mode, KV bytes uploaded and
// narrow queue; npu_svc's modelled NPU and compiled graphs.
nlohmann::json device_status(const std::string& run_dir, int timeout_ms) {
  nlohmann::json out = nlohmann::json::object();
  for (const duet::ServiceId id : {duet::ServiceId::gpu, duet::ServiceId::npu}) {
    const std::string name(duet::service_name(id));
    out[name] = query_status(duet::control_socket_path(run_dir, id), name, "", timeout_ms);
  }
  return out;
}

nlohmann::json frontend_status(const StatusArgs& a) {
  try {
    duet::client::Client c(duet::client::stack_endpoint(a.stack, a.run_dir));
    return c.status(std::chrono::milliseconds(a.timeout_ms));
  } catch (const std::exception& e) {
    return {{"error", e.what()}};
  }
}

double num(const nlohmann::json& j, const char* a, const char* b) {
  const auto ia = j.find(a);
  if (ia == j.end()) return 0;
  const auto ib = ia->find(b);
  return ib != ia->end() && ib->is_number() ? ib->get<double>() : 0;
}

// One model's part of the frontend's status: its plan, queue, limits, metrics and KV pool.
void print_model(const nlohmann::json& fe) {
  const auto& m = fe["metrics"];
  std::printf("  frontend: plan %s, queue %d reactive + %d proactive, %zu running, %d sessions\n",
              fe.value("plan", "?").c_str(), fe["queue"].value("reactive", 0),
              fe["queue"].value("proactive", 0), fe["running"].size(), fe.value("sessions", 0));
  if (fe.contains("executed_plan"))
    std::printf("  executed here: %s\n  modelled on the SoC: %s\n",
                fe.value("executed_plan", "?").c_str(), fe.value("modeled_plan", "?").c_str());
  std::printf("  limits: %s\n", fe["limits"].dump().c_str());
  std::printf("  requests: %s\n", m["requests"].dump().c_str());
  std::printf("  tokens: prompt %.0f, generated %.0f in %.0f steps\n", num(m, "tokens", "prompt"),
              num(m, "tokens", "generated"), m.value("steps", 0.0));
  std::printf(
      "  measured: TTFT %.2f ms, TPOT %.2f ms, %.1f tok/s, queue %.2f ms, flag wait %.2f ms\n",
      num(m, "measured", "ttft_ms"), num(m, "measured", "tpot_ms"),
      num(m, "measured", "tokens_per_s"), num(m, "measured", "queue_ms"),
      num(m, "measured", "flag_wait_ms"));
  std::printf("  modelled: TTFT %.2f ms, TPOT %.2f ms, %.1f tok/s\n", num(m, "modeled", "ttft_ms"),
              num(m, "modeled", "tpot_ms"), num(m, "modeled", "tokens_per_s"));
  std::printf("  KV bytes copied %.0f, restarts seen %.0f\n", m.value("kv_bytes_copied", 0.0),
              m.value("restarts_seen", 0.0));
  // The KV page pool (issue 20), once the engine is built (the first request builds it).
  const nlohmann::json& e = fe.contains("engine") ? fe["engine"] : nlohmann::json::object();
  if (e.contains("kv_pages_total"))
    std::printf(
        "  KV pages: %.0f used, %.0f free of %.0f (%s, %.0f B each), %.0f promised to "
        "running requests, %.0f admissions waited for KV\n",
        e.value("kv_pages_used", 0.0), e.value("kv_pages_free", 0.0),
        e.value("kv_pages_total", 0.0), e.value("kv_type", "?").c_str(),
        e.value("kv_page_bytes", 0.0), e.value("kv_pages_promised", 0.0),
        e.value("kv_reserve_refusals", 0.0));
  // Prefix sharing (issue 20 item 4): cached pages are among the free ones.
  if (e.contains("kv_prefix")) {
    const nlohmann::json& p = e["kv_prefix"];
    std::printf(
        "  KV prefix sharing %s: %.0f pages shared, %.0f cached; %.0f of %.0f requests hit, "
        "%.0f blocks (%.0f tokens) not recomputed; %.0f blocks published, %.0f evicted; "
        "preemptions %.0f\n",
        e.value("kv_prefix_sharing", false) ? "on" : "off", e.value("kv_pages_shared", 0.0),
        e.value("kv_pages_cached", 0.0), p.value("hits", 0.0), p.value("lookups", 0.0),
        p.value("hit_blocks", 0.0), p.value("hit_tokens", 0.0), p.value("published_blocks", 0.0),
        p.value("evictions", 0.0), e.value("preemptions", 0.0));
  }
}

void print_devices(const nlohmann::json& dev) {
  const nlohmann::json& g = dev["gpu_svc"];
  if (g.contains("error"))
    std::printf("  gpu_svc: unavailable: %s\n", g["error"].get<std::string>().c_str());
  else
    std::printf("  gpu_svc: %s (%s), copies %s, %.0f steps, KV uploaded %.0f B, narrow queue %s\n",
                g.value("device", "?").c_str(), g.value("type", "?").c_str(),
                g.value("copies", false) ? "yes (discrete)" : "no (shared memory)",
                g.value("steps", 0.0), g.value("kv_bytes_uploaded", 0.0),
                g.value("narrow_device", "").empty()
                    ? "none"
                    : (g.value("narrow_ready", false) ? "ready" : "building"));
  const nlohmann::json& n = dev["npu_svc"];
  if (n.contains("error"))
    std::printf("  npu_svc: unavailable: %s\n", n["error"].get<std::string>().c_str());
  else
    std::printf("  npu_svc: %s's NPU (emulated), %.0f graphs compiled\n",
                n.value("soc", "?").c_str(), n.value("graphs_cached", 0.0));
}

void print_human(const std::string& stack, const nlohmann::json& sup, const nlohmann::json& dev,
                 const nlohmann::json& fe) {
  std::printf("stack %s\n", stack.c_str());
  if (sup.contains("error")) {
    std::printf("  supervisor: unavailable: %s\n", sup["error"].get<std::string>().c_str());
  } else if (sup.contains("services") && sup["services"].is_array()) {
    for (const auto& s : sup["services"])
      std::printf("  %-10s %s\n", s.value("name", "?").c_str(), s.dump().c_str());
  } else {
    std::printf("  supervisor: %s\n", sup.dump().c_str());
  }
  print_devices(dev);
  if (fe.contains("error")) {
    std::printf("  frontend: unavailable: %s\n", fe["error"].get<std::string>().c_str());
    return;
  }
  // Several models (issue 25): each one's own metrics, the default first.
  if (!fe.contains("models")) return print_model(fe);
  std::printf("  models: %zu (default %s); unknown model names refused: %.0f\n",
              fe["models"].size(), fe.value("default_model", "?").c_str(),
              fe.value("unknown_model_refusals", 0.0));
  for (const auto& [name, st] : fe["models"].items()) {
    std::printf(" model %s\n", name.c_str());
    print_model(st);
    if (const auto t = st.find("turns"); t != st.end())  // its rank among the models' steps
      std::printf(
          "  turns: rank %s, %s steps (%s while another model had work), longest wait %s of at "
          "most %s steps\n",
          (*t)["rank"].dump().c_str(), (*t)["steps"].dump().c_str(),
          (*t)["contended_steps"].dump().c_str(), (*t)["max_wait_steps"].dump().c_str(),
          (*t)["wait_bound_steps"].dump().c_str());
  }
}

int run_status(const StatusArgs& a) {
  duet::validate_stack_id(a.stack);
  const std::string run_dir = a.run_dir.empty() ? duet::default_run_dir(a.stack) : a.run_dir;
  const nlohmann::json sup = supervisor_status(run_dir, a.timeout_ms);
  const nlohmann::json dev = device_status(run_dir, a.timeout_ms);
  const nlohmann::json fe = frontend_status(a);
  if (a.json)
    std::printf(
        "%s\n",
        nlohmann::json{{"stack", a.stack}, {"supervisor", sup}, {"devices", dev}, {"frontend", fe}}
            .dump(2)
            .c_str());
  else
    print_human(a.stack, sup, dev, fe);
  if (fe.contains("error"))
    throw duet::Error(duet::Errc::unavailable, fe["error"].get<std::string>());
  return 0;
}

duet::cli::RegisterCommand register_status([](CLI::App& app) {
  auto args = std::make_shared<StatusArgs>();
  auto* cmd = app.add_subcommand(
      "status", "the stack's services and the frontend's queue, limits and metrics");
  cmd->add_option("--stack", args->stack, "stack id")->capture_default_str();
  cmd->add_option("--run-dir", args->run_dir, "run directory (default: from the stack id)");
  cmd->add_flag("--json", args->json, "print everything as JSON");
  cmd->add_option("--timeout-ms", args->timeout_ms, "deadline per query")->capture_default_str();
  cmd->callback([args] { run_status(*args); });
});

}  // namespace
