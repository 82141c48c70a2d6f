#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
int socket(int domain, int type, int protocol) {
  static int (*real)(int, int, int);
  if (!real) real = dlsym(RTLD_NEXT, "socket");
  int fd = real(domain, type, protocol);
  const char* cc = getenv("TRIB_CC");
  if (fd >= 0 && cc && (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM)
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc));
  return fd;
}
