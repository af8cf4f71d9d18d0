// Client-disconnect detection while a handler waits on a generation (docs/api.md §10.1 row 6): the handler polls the
// client's socket for a peer close. POLLRDHUP reports the client's FIN even when unread bytes are still queued
// before it (a client that sends one more byte and closes), which a MSG_PEEK would see as data. A client that
// only half-closes (shutdown(SHUT_WR)) is indistinguishable from one that closed, and is treated the same.
#pragma once

namespace lily::server {

// True when the peer closed (FIN received) or reset the connection, or the socket is in error.
bool peer_closed(int fd);

}  // namespace lily::server
