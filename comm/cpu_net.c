/* Sockets for the CPU backend: address parsing ("host:port", "[v6]:port"), listening
 * sockets (retried while the address is still held, e.g. by a communicator of the
 * previous generation being freed), nonblocking connects and socket options, and the
 * probe of peers' listeners (comm_probe_listeners) and of their links (comm_time_links). Every fd is close-on-exec and
 * nonblocking. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/cpu.h"
#include "common/clock.h"
#include "common/log.h"

int net_set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Splits "host:port" / "[host]:port" into host and port strings. */
static newt_result_t split_addr(const char *addr, char *host, size_t hcap, char *port, size_t pcap) {
  const char *colon;
  const char *h = addr;
  size_t hlen;
  if (addr[0] == '[') {
    const char *close = strchr(addr, ']');
    if (!close || close[1] != ':')
      return NEWT_ERR(NEWT_ERR_INVALID, "address \"%s\": expected [ipv6]:port", addr);
    h = addr + 1;
    hlen = (size_t)(close - h);
    colon = close + 1;
  } else {
    colon = strrchr(addr, ':');
    if (!colon) return NEWT_ERR(NEWT_ERR_INVALID, "address \"%s\": expected host:port", addr);
    hlen = (size_t)(colon - addr);
  }
  if (hlen == 0 || hlen >= hcap || strlen(colon + 1) == 0 || strlen(colon + 1) >= pcap)
    return NEWT_ERR(NEWT_ERR_INVALID, "address \"%s\": expected host:port", addr);
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  snprintf(port, pcap, "%s", colon + 1);
  for (const char *p = port; *p; p++)
    if (*p < '0' || *p > '9')
      return NEWT_ERR(NEWT_ERR_INVALID, "address \"%s\": port \"%s\" is not a number", addr, port);
  return NEWT_OK;
}

newt_result_t net_resolve(const char *addr, struct sockaddr_storage *ss, socklen_t *len) {
  char host[256], port[16];
  if (!addr) return NEWT_ERR(NEWT_ERR_INVALID, "missing address");
  NEWT_CHECK(split_addr(addr, host, sizeof host, port, sizeof port));
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(host, port, &hints, &res);
  if (rc != 0 || !res)
    return NEWT_ERR(NEWT_ERR_INVALID, "address \"%s\": cannot resolve: %s", addr, gai_strerror(rc));
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return NEWT_OK;
}

static newt_result_t listen_on(const struct sockaddr_storage *ss, socklen_t len, const char *what,
                               newt_deadline_t deadline, int *out) {
  int64_t nap_ms = 5;
  for (;;) {
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return NEWT_ERR(NEWT_ERR_SYS, "socket for %s: %s", what, strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (const struct sockaddr *)ss, len) == 0 && listen(fd, 128) == 0) {
      *out = fd;
      return NEWT_OK;
    }
    int e = errno;
    close(fd);
    if (e != EADDRINUSE || newt_deadline_passed(deadline))
      return NEWT_ERR(NEWT_ERR_SYS, "cannot listen on %s: %s%s", what, strerror(e),
                      e == EADDRINUSE ? " (is the previous communicator on it freed?)" : "");
    NEWT_DEBUG(COMM, "listen on %s: address in use, retrying", what);
    newt_sleep_ms(nap_ms);
    if (nap_ms < 100) nap_ms *= 2;
  }
}

newt_result_t net_listen(const char *addr, newt_deadline_t deadline, int *fd) {
  struct sockaddr_storage ss;
  socklen_t len;
  NEWT_CHECK(net_resolve(addr, &ss, &len));
  return listen_on(&ss, len, addr, deadline, fd);
}

newt_result_t net_listen_ephemeral(const char *like, int *fd, char *out, size_t cap) {
  struct sockaddr_storage ss;
  socklen_t len;
  NEWT_CHECK(net_resolve(like, &ss, &len));
  if (ss.ss_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = 0;
  else ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
  NEWT_CHECK(listen_on(&ss, len, like, NEWT_DEADLINE_NONE, fd));
  len = sizeof ss;
  if (getsockname(*fd, (struct sockaddr *)&ss, &len) != 0) {
    int e = errno;
    close(*fd);
    *fd = -1;
    return NEWT_ERR(NEWT_ERR_SYS, "getsockname: %s", strerror(e));
  }
  char host[INET6_ADDRSTRLEN];
  if (ss.ss_family == AF_INET) {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    snprintf(out, cap, "%s:%d", host, ntohs(a->sin_port));
  } else {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    snprintf(out, cap, "[%s]:%d", host, ntohs(a->sin6_port));
  }
  return NEWT_OK;
}

newt_result_t net_connect_start(const struct sockaddr_storage *ss, socklen_t len, int *out, int *err) {
  *err = 0;
  int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return NEWT_ERR(NEWT_ERR_SYS, "socket: %s", strerror(errno));
  if (connect(fd, (const struct sockaddr *)ss, len) != 0 && errno != EINPROGRESS) {
    int e = errno;
    *err = e;
    close(fd);
    return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "connect: %s", strerror(e));
  }
  *out = fd;
  return NEWT_OK;
}

void net_tune(int fd, int data) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int buf = (int)newt_param_CommTcpBuf();
  if (data && buf > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  }
}

void net_peer_name(int fd, char *out, size_t cap) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *a = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
      port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      port = ntohs(a->sin6_port);
    }
  }
  snprintf(out, cap, "%s:%d", host, port);
}

int net_accept(int lfd, char *remote, size_t cap) {
  int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) net_peer_name(fd, remote, cap);
  return fd;
}

/* --- the probe of listeners (comm.h) ------------------------------------------------------- */

/* The outcome of a connect that completed (or failed) on fd: 1 connected, 0 refused, -1
 * another error. */
static int connect_outcome(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return -1;
  return err == 0 ? 1 : err == ECONNREFUSED ? 0 : -1;
}

/* One connection to each of addrs[0..n), all at once, driven until each is done or the
 * deadline passed: ready(ud, i, fd, &events) after poll said fd is ready returns 1 when it is
 * done with it (it is closed), 0 to be polled again for *events; refused(ud, i, err) for one
 * that could not start (err: the connect's errno, 0: no address). Polled at least once, also
 * past the deadline: a prober that lost the CPU for longer still sees the connections the
 * kernels made meanwhile. */
typedef int (*conn_ready_fn)(void *ud, int i, int fd, short *events);
static newt_result_t connect_all(const char *const *addrs, int n, int64_t timeout_ms, conn_ready_fn ready,
                                 void (*refused)(void *ud, int i, int err), void *ud) {
  struct pollfd *fds = calloc((size_t)(n ? n : 1), sizeof *fds);
  NEWT_CHECK_ALLOC(fds);
  int pending = 0;
  for (int i = 0; i < n; i++) {
    fds[i].fd = -1;
    struct sockaddr_storage ss;
    socklen_t len;
    int err = 0;
    if (!addrs[i] || !addrs[i][0] || net_resolve(addrs[i], &ss, &len) != NEWT_OK ||
        net_connect_start(&ss, len, &fds[i].fd, &err) != NEWT_OK) {
      newt_err_clear();
      fds[i].fd = -1;
      refused(ud, i, err);
      continue;
    }
    fds[i].events = POLLOUT;
    pending++;
  }
  newt_deadline_t d = newt_deadline_in_ms(timeout_ms);
  for (int last = 0; pending > 0 && !last;) {
    int64_t left = newt_deadline_left_ms(d);
    last = left <= 0;
    int rc = poll(fds, (nfds_t)n, (int)(left > 0 ? left : 0));
    if (rc < 0 && errno != EINTR) break;
    for (int i = 0; rc > 0 && i < n; i++) {
      if (fds[i].fd < 0 || !fds[i].revents) continue;
      if (!ready(ud, i, fds[i].fd, &fds[i].events)) continue;
      close(fds[i].fd);
      fds[i].fd = -1;
      pending--;
    }
  }
  for (int i = 0; i < n; i++)
    if (fds[i].fd >= 0) close(fds[i].fd);
  free(fds);
  return NEWT_OK;
}

static int listener_ready(void *ud, int i, int fd, short *events) {
  (void)events;
  ((int *)ud)[i] = connect_outcome(fd);
  return 1;
}

static void listener_refused(void *ud, int i, int err) { ((int *)ud)[i] = err == ECONNREFUSED ? 0 : -1; }

newt_result_t comm_probe_listeners(const char *const *addrs, int n, int64_t timeout_ms, int *state) {
  if (n < 0 || (n > 0 && (!addrs || !state)))
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_probe_listeners: %d addresses, addrs and state are required", n);
  for (int i = 0; i < n; i++) state[i] = -1;
  return connect_all(addrs, n, timeout_ms, listener_ready, listener_refused, state);
}

/* --- the link probe (comm_time_links) -------------------------------------------------- */

/* The probes under way: each one's progress (what it has sent of header and bytes, what it
 * has read of the 8-byte answer), and each one's time. */
typedef struct link_probes {
  const uint8_t *head;
  size_t bytes;
  uint64_t t0;
  double *ms;
  struct link_probe {
    int connected;
    size_t sent, got;
    uint8_t ans[8];
  } *p;
} link_probes;

/* Advances probe i after poll said its socket is ready: 1 done (answered: its time noted;
 * or failed), 0 not yet. */
static int link_probe_ready(void *ud, int i, int fd, short *events) {
  static const uint8_t zeros[65536];
  link_probes *lp = ud;
  struct link_probe *p = &lp->p[i];
  if (!p->connected) {
    if (connect_outcome(fd) != 1) return 1;
    p->connected = 1;
  }
  size_t total = HS_HELLO_LEN + lp->bytes;
  while (p->sent < total) {
    const uint8_t *from = p->sent < HS_HELLO_LEN ? lp->head + p->sent : zeros;
    size_t len = p->sent < HS_HELLO_LEN ? HS_HELLO_LEN - p->sent : total - p->sent;
    if (len > sizeof zeros) len = sizeof zeros;
    ssize_t n = send(fd, from, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) p->sent += (size_t)n;
    else if (n < 0 && errno == EINTR) continue;
    else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return *events = POLLOUT, 0;
    else return 1;
  }
  while (p->got < sizeof p->ans) {
    ssize_t n = recv(fd, p->ans + p->got, sizeof p->ans - p->got, MSG_DONTWAIT);
    if (n > 0) p->got += (size_t)n;
    else if (n < 0 && errno == EINTR) continue;
    else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return *events = POLLIN, 0;
    else return 1;
  }
  if (memcmp(p->ans, HS_PROBE_MAGIC, 8) == 0) lp->ms[i] = (double)(newt_now_ns() - lp->t0) / 1e6;
  return 1;
}

static void link_probe_refused(void *ud, int i, int err) {
  (void)ud, (void)i, (void)err; /* its time stays -1 */
}

newt_result_t comm_time_links(const char *const *addrs, int n, size_t bytes, int64_t timeout_ms, double *ms) {
  if (n < 0 || (n > 0 && (!addrs || !ms)) || bytes > COMM_LINK_PROBE_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_time_links: %d addresses of %zu bytes (at most %u), addrs and ms are required",
                    n, bytes, COMM_LINK_PROBE_MAX);
  uint8_t head[HS_HELLO_LEN];
  memset(head, 0, sizeof head);
  memcpy(head, HS_PROBE_MAGIC, 8);
  le_put32(head + 8, HS_PROBE_VERSION);
  le_put32(head + 12, (uint32_t)bytes);
  link_probes lp = {.head = head, .bytes = bytes, .ms = ms, .p = calloc((size_t)(n ? n : 1), sizeof *lp.p)};
  NEWT_CHECK_ALLOC(lp.p);
  for (int i = 0; i < n; i++) ms[i] = -1;
  lp.t0 = newt_now_ns();
  newt_result_t r = connect_all(addrs, n, timeout_ms, link_probe_ready, link_probe_refused, &lp);
  free(lp.p);
  return r;
}
