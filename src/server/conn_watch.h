// Client-disconnect detection for the HTTP layer. cpp-httplib 0.11 gives handlers no access to their socket,
// so the handler finds it once by its addresses (the accepted socket whose local and peer address/port equal
// the request's) and then polls it with a non-blocking MSG_PEEK: a read of 0 bytes or a reset means the
// client went away (docs/api.md §10.1 row 6). The fd stays valid while the handler runs: httplib closes it after.
#pragma once
#include <string>

namespace lily::server {

// The fd of this process's connected socket with the given addresses, or -1 when none matches.
int find_connection_fd(const std::string& local_addr, int local_port, const std::string& remote_addr,
                       int remote_port);

// True when the peer closed or reset the connection (pending unread bytes count as alive).
bool peer_closed(int fd);

}  // namespace lily::server
