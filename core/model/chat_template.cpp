#include "core/model/chat_template.h"

#include <algorithm>
#include <array>

#include "core/base/error.h"

namespace duet {
namespace {

enum class Family {
  llama3,
  llama2,
  llama2_sys,
  llama2_sys_bos,
  llama2_sys_strip,
  chatml,
  mistral_v1,
  mistral_v3,
  mistral_v3_tekken,
  mistral_v7,
  mistral_v7_tekken,
  gemma,
  zephyr,
};

struct NamedFamily {
  std::string_view name;
  Family family;
};

constexpr std::array<NamedFamily, 13> kFamilies{{
    {"llama3", Family::llama3},
    {"llama2", Family::llama2},
    {"llama2-sys", Family::llama2_sys},
    {"llama2-sys-bos", Family::llama2_sys_bos},
    {"llama2-sys-strip", Family::llama2_sys_strip},
    {"chatml", Family::chatml},
    {"mistral-v1", Family::mistral_v1},
    {"mistral-v3", Family::mistral_v3},
    {"mistral-v3-tekken", Family::mistral_v3_tekken},
    {"mistral-v7", Family::mistral_v7},
    {"mistral-v7-tekken", Family::mistral_v7_tekken},
    {"gemma", Family::gemma},
    {"zephyr", Family::zephyr},
}};

std::string_view name_of(Family f) {
  for (const auto& n : kFamilies)
    if (n.family == f) return n.name;
  throw Error(Errc::internal, "chat template family without a name");
}

std::string known_names() {
  std::string s;
  for (const auto& n : kFamilies) s += (s.empty() ? "" : ", ") + std::string(n.name);
  return s;
}

// What a detection ends in: a family duet formats, or the name of one llama.cpp formats and duet
// does not (kept so the error can say so, and so a template is never taken for a later family
// that llama.cpp's ordered checks would not have reached).
struct Detected {
  bool known = false;
  Family family = Family::chatml;
  std::string_view other;  // llama.cpp's name when !known ("" = nothing matched)
};

Detected fam(Family f) {
  return {true, f, {}};
}
Detected other(std::string_view name) {
  return {false, Family::chatml, name};
}

// llama.cpp's llm_chat_detect_template (src/llama-chat.cpp), in its order, up to the last family
// duet formats (llama3); the families after it in llama.cpp's chain need nothing from duet.
Detected detect_by_substrings(std::string_view t) {
  const auto has = [t](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has("<|im_start|>")) {
    if (has("<|im_sep|>")) return other("phi4");
    if (has("<end_of_utterance>")) return other("smolvlm");
    return fam(Family::chatml);
  }
  if (t.starts_with("mistral") || has("[INST]")) {
    if (has("[SYSTEM_PROMPT]")) return fam(Family::mistral_v7);
    if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
      if (has(" [INST]")) return fam(Family::mistral_v1);
      if (has("\"[INST]\"")) return fam(Family::mistral_v3_tekken);
      return fam(Family::mistral_v3);
    }
    if (has("content.strip()")) return fam(Family::llama2_sys_strip);
    if (has("bos_token + '[INST]")) return fam(Family::llama2_sys_bos);
    if (has("<<SYS>>")) return fam(Family::llama2_sys);
    return fam(Family::llama2);
  }
  if (has("<|assistant|>") && has("<|end|>")) return other("phi3");
  if (has("[gMASK]<sop>")) return other("chatglm4");
  if (has("<|assistant|>") && has("<|user|>")) return other(has("</s>") ? "falcon3" : "glmedge");
  if (has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>")) return other("glmedge");
  if (has("<|user|>") && has("<|endoftext|>")) return fam(Family::zephyr);
  if (has("bos_token + message['role']")) return other("monarch");
  if (has("<start_of_turn>")) return fam(Family::gemma);
  if (has("'\\n\\nAssistant: ' + eos_token")) return other("orion");
  if (has("GPT4 Correct ")) return other("openchat");
  if (has("USER: ") && has("ASSISTANT: ")) return other(has("SYSTEM: ") ? "vicuna-orca" : "vicuna");
  if (has("### Instruction:") && has("<|EOT|>")) return other("deepseek");
  if (has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>")) return other("command-r");
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return fam(Family::llama3);
  return {};
}

Family family_of(std::string_view name_or_jinja) {
  for (const auto& n : kFamilies)
    if (n.name == name_or_jinja) return n.family;
  const Detected d = detect_by_substrings(name_or_jinja);
  if (d.known) return d.family;
  std::string shown(name_or_jinja.substr(0, 80));
  if (name_or_jinja.size() > 80) shown += "...";
  if (!d.other.empty())
    throw Error(Errc::unsupported,
                "chat template \"" + shown + "\" is llama.cpp's '" + std::string(d.other) +
                    "' family, which duet does not format; known templates: " + known_names() +
                    " (force one with --chat-template NAME)");
  throw Error(Errc::unsupported, "unrecognised chat template \"" + shown + "\"; known templates: " +
                                     known_names() + " (force one with --chat-template NAME)");
}

// llama.cpp's trim(): ASCII whitespace (isspace in the C locale) off both ends.
std::string_view trim(std::string_view s) {
  constexpr std::string_view ws = " \t\n\v\f\r";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Appends template bytes and message bytes, keeping the spans of each.
class Formatter {
 public:
  explicit Formatter(size_t n_messages) : placed_(n_messages, false) {
    out_.content_spans.resize(n_messages);
  }

  void marker(std::string_view s) {
    if (s.empty()) return;
    const size_t begin = out_.text.size();
    out_.text += s;
    auto& spans = out_.special_spans;
    if (!spans.empty() && spans.back().end == begin)
      spans.back().end = out_.text.size();
    else
      spans.push_back({begin, out_.text.size()});
  }
  void content(size_t message, std::string_view s) {
    const size_t begin = out_.text.size();
    out_.text += s;
    out_.content_spans[message] = {begin, out_.text.size()};
    placed_[message] = true;
  }
  FormattedChat finish() {
    // A message the family dropped (gemma's system prompt with no user turn after it) is an
    // empty span at the end.
    for (size_t i = 0; i < placed_.size(); ++i)
      if (!placed_[i]) out_.content_spans[i] = {out_.text.size(), out_.text.size()};
    return std::move(out_);
  }

 private:
  FormattedChat out_;
  std::vector<bool> placed_;
};

enum class Role { system, user, assistant };

Role role_of(const ChatMessage& m, size_t index) {
  if (m.role == "system") return Role::system;
  if (m.role == "user") return Role::user;
  if (m.role == "assistant") return Role::assistant;
  throw Error(Errc::invalid_argument, "message " + std::to_string(index) + " has role \"" + m.role +
                                          "\"; a chat message's role is system, user " +
                                          "or assistant");
}

// Each family's format follows llama.cpp's llm_chat_apply_template (src/llama-chat.cpp).

void format_chatml(Formatter& f, std::span<const ChatMessage> msgs, bool add_ass) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    f.marker("<|im_start|>" + msgs[i].role + "\n");
    f.content(i, msgs[i].content);
    f.marker("<|im_end|>\n");
  }
  if (add_ass) f.marker("<|im_start|>assistant\n");
}

void format_llama3(Formatter& f, std::span<const ChatMessage> msgs, bool add_ass) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    f.marker("<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n");
    f.content(i, trim(msgs[i].content));
    f.marker("<|eot_id|>");
  }
  if (add_ass) f.marker("<|start_header_id|>assistant<|end_header_id|>\n\n");
}

void format_zephyr(Formatter& f, std::span<const ChatMessage> msgs, bool add_ass) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    f.marker("<|" + msgs[i].role + "|>\n");
    f.content(i, msgs[i].content);
    f.marker("<|endoftext|>\n");
  }
  if (add_ass) f.marker("<|assistant|>\n");
}

// Llama 2 and its variants: every turn opens "[INST] " (BOS comes from the tokenizer's
// add_special for the first; the -bos variant writes "<s>" before the later ones), a user
// message closes it with " [/INST]", an assistant message ends with "</s>". No generation prompt:
// " [/INST]" is where the reply starts.
void format_llama2(Formatter& f, Family fam_, std::span<const ChatMessage> msgs) {
  const bool system_block = fam_ != Family::llama2;
  const bool bos_in_history = fam_ == Family::llama2_sys_bos;
  const bool strip = fam_ == Family::llama2_sys_strip;
  bool inside_turn = true;
  f.marker("[INST] ");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string_view content = strip ? trim(msgs[i].content) : msgs[i].content;
    const Role role = role_of(msgs[i], i);
    if (!inside_turn) {
      inside_turn = true;
      f.marker(bos_in_history ? "<s>[INST] " : "[INST] ");
    }
    if (role == Role::system) {
      if (system_block) f.marker("<<SYS>>\n");
      f.content(i, content);
      f.marker(system_block ? "\n<</SYS>>\n\n" : "\n");
    } else if (role == Role::user) {
      f.content(i, content);
      f.marker(" [/INST]");
    } else {
      f.content(i, content);
      f.marker("</s>");
      inside_turn = false;
    }
  }
}

// Mistral's official v1 / v3 / v3-tekken: a system message opens the turn's [INST] like a user
// message and ends with a blank line; v1 puts a space before "[INST]" and "[/INST]", v3 and v1 one
// after "[INST]" and before a reply, v3 trims the reply.
void format_mistral_v1_v3(Formatter& f, Family fam_, std::span<const ChatMessage> msgs) {
  const std::string_view lead = fam_ == Family::mistral_v1 ? " " : "";
  const std::string_view trail = fam_ == Family::mistral_v3_tekken ? "" : " ";
  const bool trim_reply = fam_ == Family::mistral_v3;
  bool inside_turn = false;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (!inside_turn) {
      f.marker(std::string(lead) + "[INST]" + std::string(trail));
      inside_turn = true;
    }
    const Role role = role_of(msgs[i], i);
    if (role == Role::system) {
      f.content(i, msgs[i].content);
      f.marker("\n\n");
    } else if (role == Role::user) {
      f.content(i, msgs[i].content);
      f.marker(std::string(lead) + "[/INST]");
    } else {
      f.marker(trail);
      f.content(i, trim_reply ? trim(msgs[i].content) : std::string_view(msgs[i].content));
      f.marker("</s>");
      inside_turn = false;
    }
  }
}

// Mistral v7 (and v7-tekken, without the spaces): the system prompt has its own markers.
void format_mistral_v7(Formatter& f, Family fam_, std::span<const ChatMessage> msgs) {
  const std::string space = fam_ == Family::mistral_v7 ? " " : "";
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Role role = role_of(msgs[i], i);
    if (role == Role::system) {
      f.marker("[SYSTEM_PROMPT]" + space);
      f.content(i, msgs[i].content);
      f.marker("[/SYSTEM_PROMPT]");
    } else if (role == Role::user) {
      f.marker("[INST]" + space);
      f.content(i, msgs[i].content);
      f.marker("[/INST]");
    } else {
      f.marker(space);
      f.content(i, msgs[i].content);
      f.marker("</s>");
    }
  }
}

// Gemma has no system role: system text (trimmed, concatenated) opens the next user turn, then a
// blank line. The assistant is "model"; every content is trimmed.
void format_gemma(Formatter& f, std::span<const ChatMessage> msgs, bool add_ass) {
  std::vector<size_t> waiting_system;  // system messages not written yet
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Role role = role_of(msgs[i], i);
    if (role == Role::system) {
      if (!trim(msgs[i].content).empty()) waiting_system.push_back(i);
      continue;
    }
    f.marker(role == Role::assistant ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
    if (!waiting_system.empty() && role == Role::user) {
      for (const size_t s : waiting_system) f.content(s, trim(msgs[s].content));
      f.marker("\n\n");
      waiting_system.clear();
    }
    f.content(i, trim(msgs[i].content));
    f.marker("<end_of_turn>\n");
  }
  if (add_ass) f.marker("<start_of_turn>model\n");
}

}  // namespace

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& n : kFamilies) v.emplace_back(n.name);
    return v;
  }();
  return names;
}

std::string detect_chat_template(std::string_view name_or_jinja) {
  return std::string(name_of(family_of(name_or_jinja)));
}

FormattedChat apply_chat_template(std::string_view family, std::span<const ChatMessage> messages,
                                  bool add_generation_prompt) {
  const Family fam_ = family_of(family);
  for (size_t i = 0; i < messages.size(); ++i) role_of(messages[i], i);
  Formatter f(messages.size());
  switch (fam_) {
    case Family::chatml:
      format_chatml(f, messages, add_generation_prompt);
      break;
    case Family::llama3:
      format_llama3(f, messages, add_generation_prompt);
      break;
    case Family::zephyr:
      format_zephyr(f, messages, add_generation_prompt);
      break;
    case Family::gemma:
      format_gemma(f, messages, add_generation_prompt);
      break;
    case Family::llama2:
    case Family::llama2_sys:
    case Family::llama2_sys_bos:
    case Family::llama2_sys_strip:
      format_llama2(f, fam_, messages);
      break;
    case Family::mistral_v1:
    case Family::mistral_v3:
    case Family::mistral_v3_tekken:
      format_mistral_v1_v3(f, fam_, messages);
      break;
    case Family::mistral_v7:
    case Family::mistral_v7_tekken:
      format_mistral_v7(f, fam_, messages);
      break;
  }
  return f.finish();
}

std::string resolve_chat_template(std::string_view forced, std::string_view model_template) {
  if (!forced.empty()) return detect_chat_template(forced);
  if (model_template.empty())
    throw Error(Errc::invalid_argument,
                "the model has no chat template (tokenizer.chat_template); name one with "
                "--chat-template NAME (known: " +
                    known_names() + ")");
  return detect_chat_template(model_template);
}

}  // namespace duet
