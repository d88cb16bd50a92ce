// libFuzzer: any bytes as a control-plane Message, a client-API ClientMessage and a Program.
// Verification must refuse what is malformed; what passes must be fully readable (unpacked
// through the object API) and a program must pass or fail validate_program cleanly.
#include <cstdint>
#include <span>
#include <vector>

#include "core/base/error.h"
#include "core/ipc/messaging.h"
#include "core/program/program.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // flatbuffers needs aligned buffers: copy as a receiver does.
  std::vector<uint8_t> bytes(data, data + size);
  try {
    const duet::fb::Message* m = duet::msg::verify_control(bytes);
    auto unpacked = std::unique_ptr<duet::fb::MessageT>(m->UnPack());
    if (const auto* reg = m->body_as_RegisterProgram(); reg && reg->program()) {
      std::unique_ptr<duet::fb::ProgramT> p(reg->program()->UnPack());
      std::vector<uint8_t> arena(4096), kv(4096), weights(4096);
      duet::ProgramMemory mem{arena.data(), arena.size(),   kv.data(),
                              kv.size(),    weights.data(), weights.size()};
      duet::validate_program(*p, mem);
    }
  } catch (const duet::Error&) {
  }
  try {
    const duet::fb::client::ClientMessage* c = duet::msg::verify_client(bytes);
    auto unpacked = std::unique_ptr<duet::fb::client::ClientMessageT>(c->UnPack());
  } catch (const duet::Error&) {
  }
  return 0;
}
