// The listening socket the supervisor binds for http_svc (core/ipc/listen_socket.h).
#include "core/ipc/listen_socket.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/base/error.h"

namespace duet {
namespace {

TEST(ListenAddress, ParsesPortAddressAndBracketedIpv6) {
  EXPECT_EQ(parse_listen_address("8080").host, "127.0.0.1");
  EXPECT_EQ(parse_listen_address("8080").port, 8080);
  EXPECT_EQ(parse_listen_address("0.0.0.0:81").host, "0.0.0.0");
  EXPECT_EQ(parse_listen_address("[::1]:82").host, "::1");
  EXPECT_EQ(parse_listen_address("[::1]:82").port, 82);
  for (const char* bad : {"", "x", "70000", "-1", "host:", ":80", "[::1]80", "80x"}) {
    try {
      parse_listen_address(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(ListenSocket, QueuesConnectionsUntilSomeoneAccepts) {
  const int fd = open_listening_socket({"127.0.0.1", 0});
  ASSERT_TRUE(is_listening_socket(fd));
  const int port = bound_port(fd);
  ASSERT_GT(port, 0);
  // Nobody accepts yet: the connection completes in the kernel's queue (the restart window).
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  const int accepted = accept(fd, nullptr, nullptr);
  EXPECT_GE(accepted, 0);
  EXPECT_FALSE(is_listening_socket(accepted));
  EXPECT_FALSE(is_listening_socket(client));
  close(accepted);
  close(client);
  // The port is taken while the socket lives: a second bind names the address.
  try {
    close(open_listening_socket({"127.0.0.1", port}));
    ADD_FAILURE() << "bound a port in use";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
  close(fd);
}

}  // namespace
}  // namespace duet
