#pragma once
// What the http_svc tests share: a free port, a shell, and reading an SSE completion stream.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/shell.h"

namespace duet::test_support {

// A TCP port of 127.0.0.1 that was free a moment ago.
inline int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

using Shell = CliResult;

inline Shell sh(const std::string& cmd) {
  return run_shell(cmd);
}

// The text of an SSE completion stream (curl -N output), and whether it ended with [DONE].
struct Sse {
  std::string text, finish;
  bool done = false;
  int chunks = 0;
};

inline Sse parse_sse(const std::string& body) {
  using nlohmann::json;
  Sse s;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end == std::string::npos ? end : end - pos - 6);
    pos = end == std::string::npos ? body.size() : end;
    if (data == "[DONE]") {
      s.done = true;
      continue;
    }
    const json j = json::parse(data);
    if (!j.contains("choices") || j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    if (c.contains("text")) s.text += c["text"].get<std::string>();
    if (c.contains("delta") && c["delta"].contains("content"))
      s.text += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) s.finish = c["finish_reason"];
    ++s.chunks;
  }
  return s;
}

}  // namespace duet::test_support
