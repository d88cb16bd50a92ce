#include "services/http_svc/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/model/utf8.h"

namespace duet::http {

using nlohmann::json;

json ApiError::to_json() const {
  return {{"error",
           {{"message", what()},
            {"type", type_},
            {"param", param_.empty() ? json(nullptr) : json(param_)},
            {"code", code_.empty() ? json(nullptr) : json(code_)}}}};
}

ApiError bad_request(const std::string& param, const std::string& message) {
  return ApiError(400, "invalid_request_error", message, param);
}

ApiError from_duet_error(const Error& e) {
  const std::string m = e.what();
  switch (e.code()) {
    case Errc::invalid_argument:
    case Errc::out_of_range:
    case Errc::bad_format:
    case Errc::unsupported:
      return ApiError(400, "invalid_request_error", m);
    case Errc::not_found:
      return ApiError(404, "invalid_request_error", m, "", "not_found");
    case Errc::busy:
      return ApiError(429, "rate_limit_error", m, "", "queue_full");
    case Errc::unavailable:
    case Errc::timeout:
    case Errc::io:
      return ApiError(503, "service_unavailable", m, "", std::string(errc_name(e.code())));
    case Errc::cancelled:
      return ApiError(499, "cancelled", m);
    default:
      return ApiError(500, "server_error", m);
  }
}

namespace {

const char* type_name(const json& v) {
  return v.type_name();
}

double number_field(const json& body, const char* name, double lo, double hi) {
  const json& v = body.at(name);
  if (!v.is_number())
    throw bad_request(name, std::string("'") + name + "' must be a number, not " + type_name(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw bad_request(name, std::string("'") + name + "' must be between " + json(lo).dump() +
                                " and " + json(hi).dump() + ", not " + v.dump());
  return x;
}

int64_t integer_field(const json& body, const char* name, int64_t lo, int64_t hi) {
  const json& v = body.at(name);
  if (v.is_number_integer()) {
    const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)
                          ? INT64_MAX
                          : v.get<int64_t>();
    if (x < lo || x > hi)
      throw bad_request(name, std::string("'") + name + "' must be between " + std::to_string(lo) +
                                  " and " + std::to_string(hi) + ", not " + v.dump());
    return x;
  }
  throw bad_request(name, std::string("'") + name + "' must be an integer, not " +
                              (v.is_number() ? v.dump() : std::string(type_name(v))));
}

bool bool_field(const json& body, const char* name) {
  const json& v = body.at(name);
  if (!v.is_boolean())
    throw bad_request(name, std::string("'") + name + "' must be true or false, not " + v.dump());
  return v.get<bool>();
}

bool present(const json& body, const char* name) {
  auto it = body.find(name);
  return it != body.end() && !it->is_null();
}

client::Priority parse_priority_value(const std::string& value, const char* where) {
  if (value == "reactive") return client::Priority::reactive;
  if (value == "proactive") return client::Priority::proactive;
  throw bad_request(
      where, std::string(where) + " must be \"reactive\" or \"proactive\", not \"" + value + "\"");
}

// OpenAI's content: a string, or an array of parts of which only {"type":"text"} are ours.
std::string message_content(const json& content, size_t i) {
  const std::string param = "messages[" + std::to_string(i) + "].content";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array())
    throw bad_request(param, param + " must be a string or an array of text parts");
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw bad_request(param, param +
                                   ": only parts {\"type\": \"text\", \"text\": \"...\"} "
                                   "are supported (this model reads text)");
    text += part["text"].get<std::string>();
  }
  return text;
}

// One prompt: a string or an array of token ids.
void parse_one_prompt(const json& p, client::GenerateRequest& g) {
  if (p.is_string()) {
    g.prompt = p.get<std::string>();
    return;
  }
  if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    for (const json& t : p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        throw bad_request("prompt", "'prompt' as token ids must hold non-negative integers only");
      g.prompt_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return;
  }
  throw bad_request("prompt",
                    "'prompt' must be a string or an array of token ids, or an array of those "
                    "(a batch of prompts)");
}

// A prompt, or a batch of them (strings or token-id arrays: lm-eval's completions client sends
// its requests so): the first into g, the others into `more` (g's copies, each its prompt).
constexpr size_t kMaxBatchPrompts = 32;
void parse_prompt(const json& body, client::GenerateRequest& g,
                  std::vector<client::GenerateRequest>& more) {
  if (!body.contains("prompt")) throw bad_request("prompt", "'prompt' is required");
  const json& p = body["prompt"];
  if (!(p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array()))) {
    parse_one_prompt(p, g);
    return;
  }
  if (p.size() > kMaxBatchPrompts)
    throw bad_request("prompt", "'prompt' holds " + std::to_string(p.size()) +
                                    " prompts, more than the " + std::to_string(kMaxBatchPrompts) +
                                    " a request may batch");
  parse_one_prompt(p[0], g);
  for (size_t i = 1; i < p.size(); ++i) {
    client::GenerateRequest other;
    parse_one_prompt(p[i], other);
    more.push_back(std::move(other));
  }
}

void parse_messages(const json& body, CompletionRequest& r) {
  if (!body.contains("messages")) throw bad_request("messages", "'messages' is required");
  const json& m = body["messages"];
  if (!m.is_array() || m.empty())
    throw bad_request("messages", "'messages' must be a non-empty array of {role, content}");
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object() || !m[i].contains("role") || !m[i]["role"].is_string())
      throw bad_request(param, param + " must be an object with a string 'role'");
    const std::string role = m[i]["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer")
      throw bad_request(param + ".role", param + ".role '" + role +
                                             "' is not one of system, developer, user, assistant");
    r.messages.push_back({role == "developer" ? "system" : role,
                          message_content(m[i].value("content", json(nullptr)), i)});
  }
}

// Completions: "logprobs": N, the N likeliest tokens' besides the sampled one's (0: its own
// only). Chat: "logprobs": true, and "top_logprobs": N with it.
void parse_logprobs(const json& body, Endpoint endpoint, client::GenerateRequest& g) {
  constexpr int64_t kMaxTop = kMaxTopLogprobs;  // core/model/sampling.h
  if (endpoint == Endpoint::completions) {
    if (present(body, "top_logprobs"))
      throw bad_request(
          "top_logprobs",
          "'top_logprobs' is a chat completions field; completions take 'logprobs': N");
    if (present(body, "logprobs")) {
      const json& v = body["logprobs"];
      if (v.is_boolean()) {
        if (v.get<bool>())
          throw bad_request("logprobs",
                            "'logprobs' of completions is the number of likeliest tokens to "
                            "return (0 to 20), not true");
        return;
      }
      g.logprobs = static_cast<int>(integer_field(body, "logprobs", 0, kMaxTop));
    }
    return;
  }
  const bool on = present(body, "logprobs") && bool_field(body, "logprobs");
  if (present(body, "top_logprobs")) {
    const int top = static_cast<int>(integer_field(body, "top_logprobs", 0, kMaxTop));
    if (!on) throw bad_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    g.logprobs = top;
  } else if (on) {
    g.logprobs = 0;
  }
}

}  // namespace

CompletionRequest parse_completion_request(Endpoint endpoint, const std::string& body_text,
                                           const std::string& header_priority) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw ApiError(400, "invalid_request_error",
                   std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!body.is_object())
    throw ApiError(400, "invalid_request_error", "the request body must be a JSON object");

  CompletionRequest r;
  r.endpoint = endpoint;
  client::GenerateRequest& g = r.generate;
  g.heartbeat_ms = 1000;  // a killed http_svc's requests are reaped within a second
  // OpenAI's default for completions is 16 tokens; chat has none (the context's end): 256 here.
  g.max_tokens = endpoint == Endpoint::completions ? 16 : 256;
  if (present(body, "model")) {
    if (!body["model"].is_string()) throw bad_request("model", "'model' must be a string");
    r.model = body["model"].get<std::string>();
  }
  if (endpoint == Endpoint::completions)
    parse_prompt(body, g, r.more);
  else
    parse_messages(body, r);

  if (present(body, "echo") && bool_field(body, "echo")) {
    if (endpoint != Endpoint::completions)
      throw bad_request("echo", "'echo' is a field of completions, not chat completions");
    r.echo = true;
    g.prompt_logprobs = true;  // the prompt tokens' logprobs, and its text back
  }
  constexpr int64_t kMaxTokens = 1 << 20;
  for (const char* name : {"max_tokens", "max_completion_tokens"})
    if (present(body, name))
      g.max_tokens = static_cast<int>(integer_field(body, name, r.echo ? 0 : 1, kMaxTokens));
  if (present(body, "temperature"))
    g.sampling.temperature = static_cast<float>(number_field(body, "temperature", 0.0, 2.0));
  if (present(body, "top_p"))
    g.sampling.top_p = static_cast<float>(number_field(body, "top_p", 0.0, 1.0));
  if (present(body, "top_k"))
    g.sampling.top_k = static_cast<int>(integer_field(body, "top_k", 0, 1 << 20));
  if (present(body, "seed")) {
    const json& v = body["seed"];
    if (!v.is_number_integer()) throw bad_request("seed", "'seed' must be an integer");
    g.sampling.seed =
        v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
  }
  if (present(body, "n") && integer_field(body, "n", 1, 128) != 1)
    throw bad_request("n", "'n' must be 1: this server returns one choice per request");
  if (present(body, "stop")) {
    const json& s = body["stop"];
    if (s.is_string()) {
      g.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& x : s) {
        if (!x.is_string()) throw bad_request("stop", "'stop' must be a string or strings");
        g.stop.push_back(x.get<std::string>());
      }
    } else {
      throw bad_request("stop", "'stop' must be a string or an array of strings");
    }
    for (const auto& x : g.stop)
      if (x.empty()) throw bad_request("stop", "a 'stop' string must not be empty");
  }
  if (present(body, "stream")) r.stream = bool_field(body, "stream");
  if (r.echo && r.stream) throw bad_request("echo", "'echo' is not supported with stream: true");
  if (present(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) throw bad_request("stream_options", "'stream_options' must be an object");
    if (!r.stream)
      throw bad_request("stream_options", "'stream_options' is only allowed with stream: true");
    if (present(so, "include_usage")) {
      if (!so["include_usage"].is_boolean())
        throw bad_request("stream_options.include_usage",
                          "'stream_options.include_usage' must be true or false");
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  for (const char* name : {"frequency_penalty", "presence_penalty"})
    if (present(body, name) && number_field(body, name, -2.0, 2.0) != 0.0)
      throw bad_request(name, std::string("'") + name + "' is not supported (only 0)");
  parse_logprobs(body, endpoint, g);
  for (const char* name :
       {"logit_bias", "best_of", "suffix", "tools", "functions", "response_format"}) {
    if (!present(body, name)) continue;
    const json& v = body[name];
    const bool harmless = (v.is_boolean() && !v.get<bool>()) ||
                          (std::string(name) == "best_of" && v == 1) ||
                          (v.is_object() && v.empty()) || (v.is_array() && v.empty());
    if (!harmless) throw bad_request(name, std::string("'") + name + "' is not supported");
  }
  if (present(body, "ignore_eos")) g.ignore_eos = bool_field(body, "ignore_eos");
  if (present(body, "chat_template")) {
    if (endpoint != Endpoint::chat || !body["chat_template"].is_string())
      throw bad_request("chat_template",
                        "'chat_template' (a family name: llama3, chatml, ...) is a string of chat "
                        "completions only");
    g.chat_template = body["chat_template"].get<std::string>();
  }
  if (!header_priority.empty())
    g.priority = parse_priority_value(header_priority, "X-Duet-Priority");
  if (present(body, "priority")) {
    if (!body["priority"].is_string())
      throw bad_request("priority", "'priority' must be \"reactive\" or \"proactive\"");
    g.priority = parse_priority_value(body["priority"].get<std::string>(), "priority");
  }
  g.stream = r.stream;
  if (!r.more.empty() && r.stream)
    throw bad_request("prompt", "a batch of prompts is not supported with stream: true");
  // The batch's other prompts take every field but their prompt from the first.
  for (client::GenerateRequest& other : r.more) {
    client::GenerateRequest copy = g;
    copy.prompt = std::move(other.prompt);
    copy.prompt_ids = std::move(other.prompt_ids);
    other = std::move(copy);
  }
  return r;
}

void apply_chat_messages(CompletionRequest& r) {
  // The frontend formats them with the model's chat template (or the family named).
  r.generate.messages.clear();
  for (const ChatMessage& m : r.messages) r.generate.messages.push_back({m.role, m.content});
}

std::string finish_reason(const std::string& duet_reason) {
  if (duet_reason == "eos" || duet_reason == "stop") return "stop";
  if (duet_reason == "length") return "length";
  return duet_reason;
}

json usage_json(const client::Stats& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.generated_tokens},
          {"total_tokens", s.prompt_tokens + s.generated_tokens}};
}

namespace {

const char* object_name(Endpoint e, bool chunk) {
  if (e == Endpoint::chat) return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}

json duet_stats(const client::Stats& s) {
  return {{"ttft_ms", s.ttft_ms},
          {"tpot_ms", s.tpot_ms},
          {"queue_ms", s.queue_ms},
          {"modeled_ttft_ms", s.modeled_ttft_ms},
          {"modeled_tpot_ms", s.modeled_tpot_ms},
          {"restarts_seen", s.restarts_seen},
          {"plan", s.plan}};
}

}  // namespace

namespace {

// A token's bytes as a JSON string: a byte-level token may hold part of a UTF-8 character,
// whose bytes become U+FFFD here (the "bytes" field has them as they are).
std::string token_text(const std::string& bytes) {
  std::string out;
  utf8::decode_replacing_invalid(bytes, true, out);
  return out;
}

json byte_list(const std::string& bytes) {
  json list = json::array();
  for (const char c : bytes) list.push_back(static_cast<uint8_t>(c));
  return list;
}

size_t code_points(const std::string& text) {
  return static_cast<size_t>(std::count_if(
      text.begin(), text.end(), [](char c) { return !utf8::is_trail_byte(uint8_t(c)); }));
}

}  // namespace

json logprobs_json(const CompletionRequest& req, const std::vector<client::TokenLogprob>& lps,
                   size_t& text_offset) {
  if (req.generate.logprobs < 0) return nullptr;
  if (req.endpoint == Endpoint::chat) {
    json content = json::array();
    for (const client::TokenLogprob& t : lps) {
      json top = json::array();
      for (const client::TokenProb& p : t.top)
        top.push_back({{"token", token_text(p.bytes)},
                       {"logprob", p.logprob},
                       {"bytes", byte_list(p.bytes)}});
      content.push_back({{"token", token_text(t.chosen.bytes)},
                         {"logprob", t.chosen.logprob},
                         {"bytes", byte_list(t.chosen.bytes)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const client::TokenLogprob& t : lps) {
    const std::string text = token_text(t.chosen.bytes);
    tokens.push_back(text);
    const bool none = std::isnan(t.chosen.logprob);  // echo's first prompt token: no context
    token_logprobs.push_back(none ? json(nullptr) : json(t.chosen.logprob));
    json alternatives = json::object();
    for (const client::TokenProb& p : t.top) {
      const std::string alt = token_text(p.bytes);
      if (!alternatives.contains(alt))
        alternatives[alt] = p.logprob;  // ids of one text: the likelier
    }
    top.push_back(req.generate.logprobs > 0 && !none ? alternatives : json(nullptr));
    offsets.push_back(text_offset);
    text_offset += code_points(text);
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

namespace {

json choice_json(const CompletionRequest& req, size_t index, const client::GenerateResult& r) {
  json choice = {{"index", index}, {"finish_reason", finish_reason(r.stats.finish_reason)}};
  size_t text_offset = 0;
  if (req.endpoint == Endpoint::chat) {
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
    choice["logprobs"] = logprobs_json(req, r.logprobs, text_offset);
  } else if (req.echo) {
    // The prompt's text as its tokens decode (what text_offset counts), then the completion.
    std::string prompt_text;
    for (const client::TokenLogprob& t : r.prompt_logprobs) prompt_text += t.chosen.bytes;
    choice["text"] = token_text(prompt_text) + r.text;
    std::vector<client::TokenLogprob> all = r.prompt_logprobs;
    all.insert(all.end(), r.logprobs.begin(), r.logprobs.end());
    choice["logprobs"] = logprobs_json(req, all, text_offset);
  } else {
    choice["text"] = r.text;
    choice["logprobs"] = logprobs_json(req, r.logprobs, text_offset);
  }
  return choice;
}

}  // namespace

json completion_response(const CompletionRequest& req, const std::string& id, int64_t created,
                         const std::string& model,
                         const std::vector<client::GenerateResult>& results) {
  json choices = json::array();
  client::Stats total;  // usage: the batch's sums
  for (size_t i = 0; i < results.size(); ++i) {
    choices.push_back(choice_json(req, i, results[i]));
    total.prompt_tokens += results[i].stats.prompt_tokens;
    total.generated_tokens += results[i].stats.generated_tokens;
  }
  return {{"id", id},
          {"object", object_name(req.endpoint, false)},
          {"created", created},
          {"model", model},
          {"choices", choices},
          {"usage", usage_json(total)},
          {"duet", duet_stats(results.front().stats)}};
}

json stream_chunk(const CompletionRequest& req, const std::string& id, int64_t created,
                  const std::string& model, const std::string& text, const std::string& finish,
                  bool first, const std::vector<client::TokenLogprob>& logprobs,
                  size_t& text_offset) {
  json choice = {
      {"index", 0},
      {"finish_reason", finish.empty() ? json(nullptr) : json(finish)},
      {"logprobs", logprobs.empty() ? json(nullptr) : logprobs_json(req, logprobs, text_offset)}};
  if (req.endpoint == Endpoint::chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish.empty())) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  json j = {{"id", id},
            {"object", object_name(req.endpoint, true)},
            {"created", created},
            {"model", model},
            {"choices", json::array({choice})}};
  if (req.include_usage) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const CompletionRequest& req, const std::string& id, int64_t created,
                 const std::string& model, const client::Stats& s) {
  return {{"id", id},
          {"object", object_name(req.endpoint, true)},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage", usage_json(s)},
          {"duet", duet_stats(s)}};
}

}  // namespace duet::http
