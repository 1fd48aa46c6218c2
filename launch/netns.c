/* Simulated hosts in network namespaces (see netns.h). Everything is done with `ip`, as a
 * person would by hand; the names carry our pid, so two runs never meet. A cut replaces
 * routes in the host's own namespace: the subnet's connected route by a blackhole (the
 * others), and a /32 for the bridge's address (a route through the veth while only the
 * peers are cut, a blackhole when etcd is). */
#include "launch/netns.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/proc.h"

typedef struct netns_host_state {
  int made;
  int peers_cut, etcd_cut;
  char ns[40], veth[32], peer[32], addr[24]; /* link names stay under 16: nw<5 digits>v<3> */
} netns_host_state;

struct netns_net {
  int a, b;
  char tag[16]; /* "nw<pid % 100000>" */
  char bridge[24], gateway[24];
  netns_host_state h[NETNS_HOSTS_MAX];
};

/* Runs one command (`ip`, `tc`) given as words split at spaces (our names have none); its
 * output is dropped, its failure returned with the command. */
static newt_result_t run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static newt_result_t run(const char *fmt, ...) {
  char cmd[512], words[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  snprintf(words, sizeof words, "%s", cmd);
  const char *argv[40];
  int n = 0;
  for (char *save = NULL, *t = strtok_r(words, " ", &save); t && n < 39; t = strtok_r(NULL, " ", &save)) argv[n++] = t;
  argv[n] = NULL;
  newt_spawn_opts so = {.log_path = "/dev/null"};
  pid_t pid;
  int st = 0;
  NEWT_CHECK(newt_proc_spawn(argv, &so, &pid));
  NEWT_CHECK(newt_proc_wait(pid, 10000, &st));
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return NEWT_ERR(NEWT_ERR_SYS, "newt run --netns: `%s` failed", cmd);
  return NEWT_OK;
}

newt_result_t netns_start(netns_net **out) {
  *out = NULL;
  if (geteuid() != 0)
    return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "newt run --netns needs root (it makes network namespaces with `ip netns`)");
  netns_net *n = calloc(1, sizeof *n);
  NEWT_CHECK_ALLOC(n);
  /* 10.A.B.0/24 with A, B from our pid: two runs on one machine take two subnets */
  n->a = 100 + (int)(getpid() % 100);
  n->b = (int)((getpid() / 100) % 250) + 1;
  snprintf(n->tag, sizeof n->tag, "nw%d", (int)(getpid() % 100000));
  snprintf(n->bridge, sizeof n->bridge, "%sbr", n->tag);
  snprintf(n->gateway, sizeof n->gateway, "10.%d.%d.1", n->a, n->b);
  newt_result_t r = run("ip link add %s type bridge", n->bridge);
  if (r != NEWT_OK) {
    free(n);
    return newt_err_wrap(NEWT_ERR_UNSUPPORTED, "cannot make a bridge (is iproute2 installed, and may we make links?): ");
  }
  r = run("ip addr add %s/24 dev %s", n->gateway, n->bridge);
  if (r == NEWT_OK) r = run("ip link set %s up", n->bridge);
  if (r != NEWT_OK) {
    netns_free(n);
    return r;
  }
  *out = n;
  return NEWT_OK;
}

const char *netns_gateway(const netns_net *n) { return n->gateway; }

newt_result_t netns_host(netns_net *n, int host, const char **ns, const char **addr) {
  if (host < 0 || host >= NETNS_HOSTS_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt run --netns: host %d: at most %d hosts", host, NETNS_HOSTS_MAX);
  netns_host_state *h = &n->h[host];
  if (!h->made) {
    snprintf(h->ns, sizeof h->ns, "%s-%d", n->tag, host);
    snprintf(h->veth, sizeof h->veth, "%sv%d", n->tag, host);
    snprintf(h->peer, sizeof h->peer, "%sp%d", n->tag, host);
    snprintf(h->addr, sizeof h->addr, "10.%d.%d.%d", n->a, n->b, 10 + host);
    h->made = 1; /* from here on netns_free removes what there is of it */
    NEWT_CHECK(run("ip netns add %s", h->ns));
    NEWT_CHECK(run("ip link add %s type veth peer name %s", h->veth, h->peer));
    NEWT_CHECK(run("ip link set %s netns %s", h->peer, h->ns));
    NEWT_CHECK(run("ip link set %s master %s", h->veth, n->bridge));
    NEWT_CHECK(run("ip link set %s up", h->veth));
    NEWT_CHECK(run("ip -n %s addr add %s/24 dev %s", h->ns, h->addr, h->peer));
    NEWT_CHECK(run("ip -n %s link set %s up", h->ns, h->peer));
    NEWT_CHECK(run("ip -n %s link set lo up", h->ns));
  }
  *ns = h->ns;
  *addr = h->addr;
  return NEWT_OK;
}

/* Sets host h's routes to what its cuts say. */
static newt_result_t apply(netns_net *n, netns_host_state *h) {
  char subnet[24];
  snprintf(subnet, sizeof subnet, "10.%d.%d.0/24", n->a, n->b);
  if (h->peers_cut) NEWT_CHECK(run("ip -n %s route replace blackhole %s", h->ns, subnet));
  else NEWT_CHECK(run("ip -n %s route replace %s dev %s proto kernel scope link src %s", h->ns, subnet, h->peer, h->addr));
  if (h->etcd_cut) return run("ip -n %s route replace blackhole %s/32", h->ns, n->gateway);
  if (h->peers_cut) return run("ip -n %s route replace %s/32 dev %s src %s", h->ns, n->gateway, h->peer, h->addr);
  (void)run("ip -n %s route del %s/32", h->ns, n->gateway); /* none there is fine */
  return NEWT_OK;
}

newt_result_t netns_cut(netns_net *n, int host, netns_link what, int on) {
  if (host < 0 || host >= NETNS_HOSTS_MAX || !n->h[host].made)
    return NEWT_ERR(NEWT_ERR_NOTFOUND, "newt run --netns: there is no host %d", host);
  netns_host_state *h = &n->h[host];
  if (what == NETNS_PEERS) h->peers_cut = on;
  else h->etcd_cut = on;
  return apply(n, h);
}

/* Shapes (or, kbit 0, unshapes) one device: `in` the namespace ns, or ours (NULL). */
static newt_result_t shape(const char *ns, const char *dev, int64_t kbit) {
  char pre[64] = "";
  if (ns) snprintf(pre, sizeof pre, "ip netns exec %s ", ns);
  if (kbit <= 0) {
    (void)run("%stc qdisc del dev %s root", pre, dev); /* none there is fine */
    return NEWT_OK;
  }
  NEWT_CHECK(run("%stc qdisc replace dev %s root handle 1: htb default 1", pre, dev));
  NEWT_CHECK(run("%stc class replace dev %s parent 1: classid 1:1 htb rate %lldkbit ceil %lldkbit", pre, dev,
                 (long long)kbit, (long long)kbit));
  return run("%stc qdisc replace dev %s parent 1:1 handle 10: pfifo limit 16", pre, dev);
}

newt_result_t netns_slow(netns_net *n, int host, int64_t kbit) {
  if (host < 0 || host >= NETNS_HOSTS_MAX || !n->h[host].made)
    return NEWT_ERR(NEWT_ERR_NOTFOUND, "newt run --netns: there is no host %d", host);
  netns_host_state *h = &n->h[host];
  NEWT_CHECK(shape(h->ns, h->peer, kbit)); /* what it sends */
  return shape(NULL, h->veth, kbit);       /* what it receives */
}

void netns_free(netns_net *n) {
  if (!n) return;
  for (int i = 0; i < NETNS_HOSTS_MAX; i++) {
    if (!n->h[i].made) continue;
    (void)run("ip netns del %s", n->h[i].ns); /* its end of the veth goes with it, and so the pair */
    (void)run("ip link del %s", n->h[i].veth);
  }
  (void)run("ip link del %s", n->bridge);
  free(n);
}
