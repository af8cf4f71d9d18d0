// Peer-closed polling (see conn_watch.h).
#include "server/conn_watch.h"

#include <poll.h>

namespace lily::server {

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{};
  p.fd = fd;
  p.events = POLLRDHUP;
  int n = poll(&p, 1, 0);
  if (n <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace lily::server
