/* A TCP proxy for fault injection (rdzv_test.h): one thread runs a poll loop over the
 * listening socket and every connection pair. Cutting closes every pair (the client sees a
 * reset / EOF, for real) and answers new connections by closing them at once. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proxy.h"

#include <stdio.h>

#include "common/clock.h"

#define MAX_PAIRS 64

struct tu_proxy {
  int lfd, port, target;
  int wake[2];
  pthread_t th;
  atomic_int stop, cut, cut_now, cuts_done;
  int a[MAX_PAIRS], b[MAX_PAIRS];
  int n;
};

static void close_pair(tu_proxy *p, int i) {
  close(p->a[i]);
  close(p->b[i]);
  p->a[i] = p->a[p->n - 1];
  p->b[i] = p->b[p->n - 1];
  p->n--;
}

static int connect_target(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

static void *proxy_main(void *arg) {
  tu_proxy *p = arg;
  struct pollfd fds[2 + 2 * MAX_PAIRS];
  char buf[65536];
  while (!atomic_load(&p->stop)) {
    if (atomic_exchange(&p->cut_now, 0)) {
      while (p->n) close_pair(p, 0);
      atomic_fetch_add(&p->cuts_done, 1);
    }
    int nf = 0;
    fds[nf++] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
    fds[nf++] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
    for (int i = 0; i < p->n; i++) {
      fds[nf++] = (struct pollfd){.fd = p->a[i], .events = POLLIN};
      fds[nf++] = (struct pollfd){.fd = p->b[i], .events = POLLIN};
    }
    if (poll(fds, (nfds_t)nf, 200) <= 0) continue;
    if (fds[1].revents) {
      ssize_t r = read(p->wake[0], buf, sizeof buf);
      (void)r;
    }
    if (fds[0].revents & POLLIN) {
      int c = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
      if (c >= 0) {
        int t = atomic_load(&p->cut) || p->n >= MAX_PAIRS ? -1 : connect_target(p->target);
        if (t < 0) close(c);
        else {
          p->a[p->n] = c;
          p->b[p->n] = t;
          p->n++;
        }
      }
    }
    for (int i = p->n - 1; i >= 0; i--) {
      struct pollfd *fa = &fds[2 + 2 * i], *fb = &fds[3 + 2 * i];
      int dead = 0;
      if (fa->revents) {
        ssize_t r = read(p->a[i], buf, sizeof buf);
        dead = r <= 0 || write(p->b[i], buf, (size_t)r) != r;
      }
      if (!dead && fb->revents) {
        ssize_t r = read(p->b[i], buf, sizeof buf);
        dead = r <= 0 || write(p->a[i], buf, (size_t)r) != r;
      }
      if (dead) close_pair(p, i);
    }
  }
  while (p->n) close_pair(p, 0);
  return NULL;
}

tu_proxy *tu_proxy_start(int target_port) {
  tu_proxy *p = calloc(1, sizeof *p);
  p->target = target_port;
  p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(p->lfd, 64) != 0 ||
      getsockname(p->lfd, (struct sockaddr *)&sa, &len) != 0 || pipe(p->wake) != 0) {
    perror("proxy");
    exit(1);
  }
  p->port = ntohs(sa.sin_port);
  pthread_create(&p->th, NULL, proxy_main, p);
  return p;
}

int tu_proxy_port(const tu_proxy *p) { return p->port; }

/* Returns once the proxy's thread closed every pair: what the target sends after it reaches
 * no client (waiting a fixed 100 ms instead let a loaded machine's proxy forward a watch's
 * events past the cut, test_etcd's compaction test then saw no gap to resync). */
void tu_proxy_cut(tu_proxy *p) {
  int before = atomic_load(&p->cuts_done);
  atomic_store(&p->cut, 1);
  atomic_store(&p->cut_now, 1);
  ssize_t r = write(p->wake[1], "x", 1);
  (void)r;
  while (atomic_load(&p->cuts_done) == before) newt_sleep_ms(1);
}

void tu_proxy_restore(tu_proxy *p) { atomic_store(&p->cut, 0); }

void tu_proxy_free(tu_proxy *p) {
  if (!p) return;
  atomic_store(&p->stop, 1);
  ssize_t r = write(p->wake[1], "x", 1);
  (void)r;
  pthread_join(p->th, NULL);
  close(p->lfd);
  close(p->wake[0]);
  close(p->wake[1]);
  free(p);
}
