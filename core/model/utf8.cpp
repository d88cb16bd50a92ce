#include "core/model/utf8.h"

namespace duet::utf8 {

namespace {
constexpr std::string_view kReplacementChar = "\xef\xbf\xbd";  // U+FFFD
}  // namespace

size_t valid_len(std::string_view s) {
  const auto* b = reinterpret_cast<const uint8_t*>(s.data());
  if (s.empty()) return 0;
  if (b[0] < 0x80) return 1;
  const size_t len = claimed_len(b[0]);
  if (len == 1 || s.size() < len) return 0;
  uint32_t cp = b[0] & (0x7f >> len);
  for (size_t i = 1; i < len; ++i) {
    if (!is_trail_byte(b[i])) return 0;
    cp = (cp << 6) | (b[i] & 0x3f);
  }
  static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLen[len]) return 0;
  if (cp >= 0xd800 && cp < 0xe000) return 0;
  if (cp > 0x10ffff) return 0;
  return len;
}

bool is_incomplete_prefix(std::string_view s) {
  if (s.empty()) return false;
  const size_t claimed = claimed_len(static_cast<uint8_t>(s[0]));
  if (claimed <= 1 || s.size() >= claimed) return false;
  for (size_t i = 1; i < s.size(); ++i) {
    if (!is_trail_byte(static_cast<uint8_t>(s[i]))) return false;
  }
  return true;
}

size_t decode_replacing_invalid(std::string_view bytes, bool final, std::string& out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const std::string_view rest = bytes.substr(pos);
    const size_t len = valid_len(rest);
    if (len > 0) {
      out.append(rest.substr(0, len));
      pos += len;
      continue;
    }
    if (!final && is_incomplete_prefix(rest)) break;
    out.append(kReplacementChar);
    pos += 1;
  }
  return pos;
}

size_t complete_prefix_len(std::string_view bytes) {
  // Only the last three bytes can start an unfinished character.
  const size_t first = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t i = first; i < bytes.size(); ++i) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (is_trail_byte(b)) continue;
    if (is_incomplete_prefix(bytes.substr(i))) return i;
  }
  return bytes.size();
}

void append_codepoint(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

}  // namespace duet::utf8
