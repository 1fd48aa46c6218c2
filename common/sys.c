/* Random bytes, free ports, stop signals and the host name (see sys.h). */
#include "sys.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "strutil.h"

newt_result_t newt_random_bytes(void *buf, size_t n) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = getrandom(p, n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return NEWT_ERR(NEWT_ERR_SYS, "getrandom: %s", strerror(errno));
    }
    p += r;
    n -= (size_t)r;
  }
  return NEWT_OK;
}

newt_result_t newt_random_hex(char *out, size_t n) {
  unsigned char tmp[256];
  if (n > sizeof tmp) return NEWT_ERR(NEWT_ERR_INVALID, "random_hex: %zu bytes is too many", n);
  NEWT_CHECK(newt_random_bytes(tmp, n));
  newt_hex_encode(tmp, n, out);
  return NEWT_OK;
}

newt_result_t newt_net_free_port(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return NEWT_ERR(NEWT_ERR_SYS, "socket: %s", strerror(errno));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    int e = errno;
    close(fd);
    return NEWT_ERR(NEWT_ERR_SYS, "finding a free port on 127.0.0.1: %s", strerror(e));
  }
  *port = ntohs(a.sin_port);
  close(fd);
  return NEWT_OK;
}

static atomic_int stop_sig;

static void on_stop(int sig) {
  if (sig == SIGINT && atomic_load(&stop_sig) == SIGINT) _exit(130);
  atomic_store(&stop_sig, sig);
}

void newt_signals_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
}

int newt_stop_requested(void) { return atomic_load(&stop_sig); }

void newt_stop_request(int sig) { atomic_store(&stop_sig, sig); }

const char *newt_hostname(void) {
  static char name[256];
  if (!name[0] && gethostname(name, sizeof name - 1) != 0) snprintf(name, sizeof name, "localhost");
  return name;
}
