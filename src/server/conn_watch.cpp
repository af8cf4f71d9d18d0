// Socket lookup by address and peer-closed polling (see conn_watch.h).
#include "server/conn_watch.h"

#include <arpa/inet.h>
#include <cerrno>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <cstdlib>

namespace lily::server {
namespace {

// Address text and port of a sockaddr, in the form httplib reports (inet_ntop, IPv4-mapped kept as IPv6).
bool addr_of(const sockaddr_storage& ss, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    if (!inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf)) return false;
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (!inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf)) return false;
    port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  ip = buf;
  return true;
}

bool same_ip(const std::string& a, const std::string& b) {
  if (a == b) return true;
  // "::ffff:127.0.0.1" vs "127.0.0.1"
  const std::string mapped = "::ffff:";
  if (a.rfind(mapped, 0) == 0 && a.substr(mapped.size()) == b) return true;
  if (b.rfind(mapped, 0) == 0 && b.substr(mapped.size()) == a) return true;
  return false;
}

}  // namespace

int find_connection_fd(const std::string& local_addr, int local_port, const std::string& remote_addr,
                       int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* ent = readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(ent->d_name, &end, 10);
    if (end == ent->d_name || *end != '\0' || fd < 0) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t pl = sizeof peer, sl = sizeof self;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    std::string pip, sip;
    int pport = 0, sport = 0;
    if (!addr_of(peer, pip, pport) || !addr_of(self, sip, sport)) continue;
    if (pport == remote_port && sport == local_port && same_ip(pip, remote_addr) && same_ip(sip, local_addr)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  if (n == 0) return true;
  return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

}  // namespace lily::server
