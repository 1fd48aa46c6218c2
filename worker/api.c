/* The public face of libnewt (include/newt.h): every argument checked and every call's order
 * (a misuse is NEWT_ERR_INVALID naming what is wrong, and changes nothing), the options
 * resolved from the environment, handles; then one call into the worker (worker.c,
 * state.c). Nothing here decides anything about the job. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "common/dtype.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/sys.h"
#include "worker/bridge.h"
#include "worker/internal.h"

int newt_version(void) { return NEWT_VERSION_NUMBER; }

void newt_join_opts_init_size(newt_join_opts *o, size_t size) {
  static const newt_join_opts d = NEWT_JOIN_OPTS_INIT;
  if (!o || size < sizeof o->size) return;
  if (size > sizeof d) size = sizeof d;
  memcpy(o, &d, size);
  o->size = size;
}

/* A program built against 0.1.0's header: its struct ends before `domain`. */
void(newt_join_opts_init)(newt_join_opts *o) { newt_join_opts_init_size(o, offsetof(newt_join_opts, domain)); }

void newt_tensor_init(newt_tensor *t) {
  static const newt_tensor d = NEWT_TENSOR_INIT;
  *t = d;
}

void newt_step_result_init(newt_step_result *r) {
  memset(r, 0, sizeof *r);
  r->size = sizeof *r;
}

/* A caller's struct of `size` bytes read into a full one (zeroed, or `dflt`'s values beyond
 * what the caller's holds). A struct of a newer header, longer than this library's, is taken
 * when what this library does not know of it is zero (its defaults); a field set there would
 * be ignored, so it is refused, naming its offset. */
static newt_result_t take(const void *in, size_t have, const void *dflt, void *out, size_t full, const char *what) {
  if (have < sizeof(size_t))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: its size field is %zu: initialise it (the *_init functions)", what, have);
  if (have > 65536)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: its size field is %zu: not a size (uninitialised?)", what, have);
  for (size_t k = full; k < have; k++)
    if (((const unsigned char *)in)[k] != 0)
      return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "%s: the program's header is newer than this library (libnewt %d.%d.%d "
                      "knows %zu bytes of it, the program's has %zu) and sets a field at byte %zu it does not know",
                      what, NEWT_VERSION_MAJOR, NEWT_VERSION_MINOR, NEWT_VERSION_PATCH, full, have, k);
  if (dflt) memcpy(out, dflt, full);
  else memset(out, 0, full);
  memcpy(out, in, have < full ? have : full);
  *(size_t *)out = full;
  return NEWT_OK;
}

/* Writes a full struct into the caller's, as many bytes as its size says. */
/* A struct the library writes: its size field must hold at least itself (checked before
 * anything is done for the call). */
static newt_result_t writable(const void *out, const char *what) {
  size_t have = *(const size_t *)out;
  if (have < sizeof(size_t))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: its size field is %zu: set it to sizeof the struct", what, have);
  return NEWT_OK;
}

static newt_result_t give(void *out, const void *full, size_t n, const char *what) {
  NEWT_CHECK(writable(out, what));
  size_t have = *(const size_t *)out;
  memcpy((char *)out + sizeof(size_t), (const char *)full + sizeof(size_t), (have < n ? have : n) - sizeof(size_t));
  return NEWT_OK;
}

#define CHECK_CTX(c, fn)                                                                      \
  do {                                                                                        \
    if (!(c)) return NEWT_ERR(NEWT_ERR_INVALID, "%s: the worker (newt_ctx) is NULL", fn);       \
  } while (0)

/* --- joining ----------------------------------------------------------------------------- */

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* An int option: the caller's, else the environment's (NAME), else dflt. */
static newt_result_t int_opt(int given, const char *name, int dflt, int lo, int hi, int *out) {
  if (given != NEWT_FROM_ENV) {
    *out = given;
  } else if (env(name)) {
    char *end = NULL;
    long v = strtol(env(name), &end, 10);
    if (*end || v < lo || v > hi)
      return NEWT_ERR(NEWT_ERR_INVALID, "%s=\"%s\": expected a whole number from %d to %d", name, env(name), lo, hi);
    *out = (int)v;
  } else {
    *out = dflt;
  }
  return NEWT_OK;
}

/* The strings of the options, copied into one block the worker owns. */
typedef struct strings {
  const char **slot[16];
  size_t n, bytes;
} strings;

static void keep(strings *s, const char **p) {
  if (*p) s->slot[s->n++] = p, s->bytes += strlen(*p) + 1;
}

static newt_result_t own_strings(worker *w, strings *s) {
  char *block = malloc(s->bytes ? s->bytes : 1), *at = block;
  NEWT_CHECK_ALLOC(block);
  for (size_t i = 0; i < s->n; i++) {
    size_t len = strlen(*s->slot[i]) + 1;
    memcpy(at, *s->slot[i], len);
    *s->slot[i] = at;
    at += len;
  }
  w->strings = block;
  return NEWT_OK;
}

static newt_result_t resolve(const newt_join_opts *in, worker *w, char **password) {
  worker_opts *o = &w->o;
  const char *pw_file = in->etcd_password_file ? in->etcd_password_file : env("NEWT_ETCD_PASSWORD_FILE");
  o->etcd.endpoints = in->etcd ? in->etcd : env("NEWT_ETCD") ? env("NEWT_ETCD") : "http://127.0.0.1:2379";
  o->etcd.user = in->etcd_user ? in->etcd_user : env("NEWT_ETCD_USER");
  o->etcd.ca_file = in->etcd_ca ? in->etcd_ca : env("NEWT_ETCD_CA");
  o->etcd.cert_file = in->etcd_cert ? in->etcd_cert : env("NEWT_ETCD_CERT");
  o->etcd.key_file = in->etcd_key ? in->etcd_key : env("NEWT_ETCD_KEY");
  o->job = in->job ? in->job : env("NEWT_JOB");
  o->id = in->worker_id ? in->worker_id : env("NEWT_WORKER_ID") ? env("NEWT_WORKER_ID") : env("POD_NAME");
  o->host = in->host ? in->host : env("NEWT_HOST");
  o->domain = in->domain ? in->domain : env("NEWT_DOMAIN");
  o->addr = in->addr ? in->addr : env("NEWT_ADDR") ? env("NEWT_ADDR") : env("POD_IP");
  o->secret_file = in->job_secret_file ? in->job_secret_file : env("NEWT_JOB_SECRET_FILE");
  o->step_log = in->step_log ? in->step_log : env("NEWT_STEP_LOG");
  o->metrics_addr = in->metrics_addr ? in->metrics_addr : env("NEWT_METRICS_ADDR");
  o->termination_log = in->termination_log;
  if (!o->job)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_join: no job (newt_join_opts.job, or NEWT_JOB): run the program under "
                    "newt, as `newt run -- PROGRAM [ARGS]` (or `newt worker -- PROGRAM`), which sets NEWT_JOB, "
                    "NEWT_ETCD and the rest");
  NEWT_CHECK(int_opt(in->port, "NEWT_PORT", 0, 0, 65535, &o->port));
  NEWT_CHECK(int_opt(in->device, "NEWT_DEVICE", -1, -1, 4095, &o->device));
  NEWT_CHECK(int_opt(in->share_device, "NEWT_SHARE_DEVICE", 0, 0, 1, &o->share_device));
  NEWT_CHECK(int_opt(in->metrics_port, "NEWT_METRICS_PORT", 0, 0, 65535, &o->metrics_port));
  if (o->port < 0 || o->port > 65535 || o->metrics_port < 0 || o->metrics_port > 65535)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_join: port %d and metrics_port %d must be 0 to 65535", o->port,
                    o->metrics_port);
  o->cuda_stream = in->cuda_stream;
  o->handle_signals = in->handle_signals != 0;
  o->spec_wait_ms = in->spec_wait_ms;
  if (o->spec_wait_ms <= 0) { /* 0: NEWT_SPEC_WAIT_MS, else 60 s (read_spec) */
    int ms = 0;
    NEWT_CHECK(int_opt(NEWT_FROM_ENV, "NEWT_SPEC_WAIT_MS", 0, 1, 86400000, &ms));
    o->spec_wait_ms = ms;
  }
  if (in->memory) NEWT_CHECK(take(in->memory, in->memory->size, NULL, &o->memory, sizeof o->memory, "newt_join_opts.memory"));
  if (o->etcd.user) {
    if (!pw_file) return NEWT_ERR(NEWT_ERR_INVALID, "newt_join: etcd user %s needs a password file", o->etcd.user);
    size_t len = 0;
    NEWT_CHECK(newt_fs_read_all(pw_file, 4096, password, &len));
    while (len > 0 && ((*password)[len - 1] == '\n' || (*password)[len - 1] == '\r')) (*password)[--len] = '\0';
    o->etcd.password = *password;
  }
  strings s = {0};
  const char **all[] = {&o->etcd.endpoints, &o->etcd.user,   &o->etcd.password, &o->etcd.ca_file, &o->etcd.cert_file,
                        &o->etcd.key_file,  &o->job,         &o->id,            &o->host,         &o->addr,
                        &o->domain,         &o->secret_file,    &o->step_log,    &o->metrics_addr,  &o->termination_log};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) keep(&s, all[i]);
  return own_strings(w, &s);
}

/* The memory the state's device parts are copied with: the program's own, else the CUDA
 * runtime's on its stream for a device, else the host's. */
static newt_result_t choose_memory(worker *w, const newt_memory *given) {
  newt_memory m;
  if (given && given->copy) {
    NEWT_CHECK(take(given, given->size, NULL, &m, sizeof m, "newt_memory"));
    if (!m.alloc || !m.free || !m.host_alloc || !m.host_free || !m.copy || !m.sync)
      return NEWT_ERR(NEWT_ERR_INVALID, "newt_memory: every function (alloc, free, host_alloc, host_free, copy, sync) "
                      "is needed");
  } else if (w->device >= 0) {
    NEWT_CHECK(worker_mem_cuda(&m, w->device, w->o.cuda_stream));
  } else {
    worker_mem_host(&m);
  }
  worker_mem_release(&w->o.memory);
  w->o.memory = m;
  return NEWT_OK;
}

newt_result_t newt_join(const newt_join_opts *opts, newt_ctx **out) {
  if (!out) return NEWT_ERR(NEWT_ERR_INVALID, "newt_join: out is NULL");
  *out = NULL;
  newt_join_opts in;
  newt_join_opts_init(&in);
  if (opts) {
    const newt_join_opts d = NEWT_JOIN_OPTS_INIT;
    NEWT_CHECK(take(opts, opts->size, &d, &in, sizeof in, "newt_join_opts"));
  }
  worker *w = calloc(1, sizeof *w);
  NEWT_CHECK_ALLOC(w);
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->step_log_fd = -1;
  char *password = NULL;
  newt_result_t r = resolve(&in, w, &password);
  if (password) memset(password, 0, strlen(password)), free(password);
  if (r == NEWT_OK && in.handle_signals) newt_signals_install();
  if (r == NEWT_OK) r = worker_join(w);
  if (r == NEWT_OK) r = choose_memory(w, in.memory);
  if (r != NEWT_OK) {
    (void)worker_finish(w, r); /* frees it; its message is kept */
    return r;
  }
  *out = w;
  return NEWT_OK;
}

newt_result_t newt_use_device(newt_ctx *c, void *cuda_stream, const newt_memory *memory) {
  CHECK_CTX(c, "newt_use_device");
  if (c->phase != PHASE_JOINED)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_use_device: after the first newt_step_begin (the device is in use)");
  if (c->device < 0 && !(memory && memory->copy))
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_use_device: this worker trains on the CPU (no device)");
  c->o.cuda_stream = cuda_stream;
  return choose_memory(c, memory);
}

newt_result_t newt_job_get(newt_ctx *c, newt_job_info *out) {
  CHECK_CTX(c, "newt_job_get");
  if (!out) return NEWT_ERR(NEWT_ERR_INVALID, "newt_job_get: out is NULL");
  newt_job_info i = {.size = sizeof i, .job = c->o.job, .worker_id = c->id, .steps = c->spec.steps,
                     .global_batch = c->spec.global_batch, .micro_batch = c->spec.micro_batch,
                     .zero = (int)c->spec.zero, .device = c->device, .spec_json = c->spec_json};
  return give(out, &i, sizeof i, "newt_job_info");
}

newt_result_t newt_layout_get(newt_ctx *c, newt_layout *out) {
  CHECK_CTX(c, "newt_layout_get");
  if (!out) return NEWT_ERR(NEWT_ERR_INVALID, "newt_layout_get: out is NULL");
  if (c->phase != PHASE_BUILT && c->phase != PHASE_RUNNING)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_layout_get: no generation (newt_step_begin says NEXT_GENERATION first)");
  const newt_plan *p = &c->plan;
  int64_t first, count; /* this rank's micro-batches: its share of the global batch's samples */
  plan_slice(p, c->dp_rank, &first, &count);
  newt_layout l = {.size = sizeof l, .generation = p->generation, .rank = c->me->rank, .world = p->nranks,
                   .dp = p->dp, .tp = p->tp, .pp = p->pp, .dp_rank = c->dp_rank, .tp_rank = c->tp_rank,
                   .pp_rank = c->pp_rank, .accum = (count + p->micro_batch - 1) / p->micro_batch,
                   .world_comm = c->h_world, .dp_comm = c->h_dp,
                   .tp_comm = c->h_tp, .pp_comm = c->h_pp, .accum_max = p->accum};
  return give(out, &l, sizeof l, "newt_layout");
}

/* --- collectives --------------------------------------------------------------------------- */

/* The communicator of handle h, when h is a group of the running generation. */
static newt_result_t live(const newt_comm *h, const char *fn, comm_t **out) {
  if (!h || h->magic != WORKER_COMM_MAGIC) return NEWT_ERR(NEWT_ERR_INVALID, "%s: not a group (newt_comm)", fn);
  if (!h->c || h->generation != h->w->plan.generation)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: a group of generation %llu, which ended (this is generation %llu: take its "
                    "groups from newt_layout_get)", fn, (unsigned long long)h->generation,
                    (unsigned long long)h->w->plan.generation);
  *out = h->c;
  return NEWT_OK;
}

static newt_result_t check_type(newt_dtype dt, newt_op op, const char *fn) {
  if ((unsigned)dt > NEWT_U8) return NEWT_ERR(NEWT_ERR_INVALID, "%s: element type %d is not a newt_dtype", fn, (int)dt);
  if ((unsigned)op > NEWT_MAX) return NEWT_ERR(NEWT_ERR_INVALID, "%s: operation %d is not a newt_op", fn, (int)op);
  return NEWT_OK;
}

int newt_comm_rank(const newt_comm *c) { return c && c->magic == WORKER_COMM_MAGIC && c->c ? comm_rank(c->c) : -1; }
int newt_comm_size(const newt_comm *c) { return c && c->magic == WORKER_COMM_MAGIC && c->c ? comm_size(c->c) : 0; }
newt_comm *newt_comm_host(newt_comm *c) { return c && c->magic == WORKER_COMM_MAGIC ? c->host : NULL; }

newt_result_t newt_comm_split(newt_comm *parent, int color, int key, newt_comm **out) {
  comm_t *p = NULL, *child = NULL;
  if (!out) return NEWT_ERR(NEWT_ERR_INVALID, "newt_comm_split: out is NULL");
  *out = NULL;
  NEWT_CHECK(live(parent, "newt_comm_split", &p));
  NEWT_CHECK(comm_split(p, color < 0 ? -1 : color, key, &child));
  if (!child) return NEWT_OK;
  if (!(*out = worker_comm_handle(parent->w, child, 1))) {
    comm_free(child);
    return NEWT_ERR(NEWT_ERR_NOMEM, "newt_comm_split: out of memory");
  }
  return NEWT_OK;
}

#define COLLECTIVE(fn, call)                                 \
  comm_t *cc = NULL;                                         \
  NEWT_CHECK(live(c, fn, &cc));                              \
  NEWT_CHECK(check_type(dt, op, fn));                        \
  return call;

newt_result_t newt_allreduce(newt_comm *c, const void *send, void *recv, size_t count, newt_dtype dt, newt_op op) {
  COLLECTIVE("newt_allreduce", comm_allreduce(cc, send, recv, count, (newt_dtype)dt, (comm_op)op))
}
newt_result_t newt_reduce_scatter(newt_comm *c, const void *send, void *recv, size_t recvcount, newt_dtype dt,
                                  newt_op op) {
  COLLECTIVE("newt_reduce_scatter", comm_reduce_scatter(cc, send, recv, recvcount, dt, (comm_op)op))
}
newt_result_t newt_allgather(newt_comm *c, const void *send, void *recv, size_t sendcount, newt_dtype dt) {
  newt_op op = NEWT_SUM;
  COLLECTIVE("newt_allgather", comm_allgather(cc, send, recv, sendcount, dt))
}
newt_result_t newt_broadcast(newt_comm *c, const void *send, void *recv, size_t count, newt_dtype dt, int root) {
  newt_op op = NEWT_SUM;
  COLLECTIVE("newt_broadcast", comm_broadcast(cc, send, recv, count, dt, root))
}
newt_result_t newt_send(newt_comm *c, const void *buf, size_t count, newt_dtype dt, int peer) {
  newt_op op = NEWT_SUM;
  COLLECTIVE("newt_send", comm_send(cc, buf, count, dt, peer))
}
newt_result_t newt_recv(newt_comm *c, void *buf, size_t count, newt_dtype dt, int peer) {
  newt_op op = NEWT_SUM;
  COLLECTIVE("newt_recv", comm_recv(cc, buf, count, dt, peer))
}
newt_result_t newt_barrier(newt_comm *c) {
  comm_t *cc = NULL;
  NEWT_CHECK(live(c, "newt_barrier", &cc));
  return comm_barrier(cc);
}

#define WORKER_REQ_MAGIC 0x6e726571u
struct newt_req {
  uint32_t magic;
  comm_req_t *r;
};

static newt_result_t wrap_req(newt_result_t r, comm_req_t *cr, newt_req **out) {
  if (r != NEWT_OK) return r;
  newt_req *q = malloc(sizeof *q);
  if (!q) {
    (void)comm_wait(cr);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a request");
  }
  *q = (newt_req){WORKER_REQ_MAGIC, cr};
  *out = q;
  return NEWT_OK;
}

#define ASYNC(fn, call)                                                          \
  comm_t *cc = NULL;                                                             \
  comm_req_t *cr = NULL;                                                         \
  if (!req) return NEWT_ERR(NEWT_ERR_INVALID, "%s: req is NULL", fn);           \
  *req = NULL;                                                                   \
  NEWT_CHECK(live(c, fn, &cc));                                                  \
  NEWT_CHECK(check_type(dt, op, fn));                                            \
  newt_result_t r_ = (call); /* before cr is read: arguments have no order */    \
  return wrap_req(r_, cr, req);

newt_result_t newt_allreduce_async(newt_comm *c, const void *send, void *recv, size_t count, newt_dtype dt, newt_op op,
                                   newt_req **req) {
  ASYNC("newt_allreduce_async", comm_allreduce_async(cc, send, recv, count, dt, (comm_op)op, &cr))
}
newt_result_t newt_reduce_scatter_async(newt_comm *c, const void *send, void *recv, size_t recvcount, newt_dtype dt,
                                        newt_op op, newt_req **req) {
  ASYNC("newt_reduce_scatter_async", comm_reduce_scatter_async(cc, send, recv, recvcount, dt, (comm_op)op, &cr))
}
newt_result_t newt_allgather_async(newt_comm *c, const void *send, void *recv, size_t sendcount, newt_dtype dt,
                                   newt_req **req) {
  newt_op op = NEWT_SUM;
  ASYNC("newt_allgather_async", comm_allgather_async(cc, send, recv, sendcount, dt, &cr))
}

newt_result_t newt_wait(newt_req *req) {
  if (!req || req->magic != WORKER_REQ_MAGIC) return NEWT_ERR(NEWT_ERR_INVALID, "newt_wait: not a request (newt_req)");
  newt_result_t r = comm_wait(req->r);
  req->magic = 0;
  free(req);
  return r;
}

/* --- the state ------------------------------------------------------------------------------- */

static newt_result_t check_name(const char *name, size_t max, const char *fn) {
  if (!name || !*name) return NEWT_ERR(NEWT_ERR_INVALID, "%s: the name is empty", fn);
  size_t n = strlen(name);
  if (n > max) return NEWT_ERR(NEWT_ERR_INVALID, "%s: the name \"%.40s...\" has %zu bytes, at most %zu", fn, name, n, max);
  for (size_t i = 0; i < n; i++)
    if (!isprint((unsigned char)name[i]) || name[i] == '"' || name[i] == '\\')
      return NEWT_ERR(NEWT_ERR_INVALID, "%s: the name \"%s\" has a character that is not printable (or a quote)", fn, name);
  return NEWT_OK;
}

static newt_result_t declaring(newt_ctx *c, const char *fn) {
  CHECK_CTX(c, fn);
  if (c->phase != PHASE_BUILT)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: the state is declared after newt_step_begin says NEXT_GENERATION and before "
                    "newt_state_restore (%s)", fn, c->phase == PHASE_RUNNING ? "this generation is restored already" : "no generation");
  return NEWT_OK;
}

newt_result_t newt_state_tensor(newt_ctx *c, const newt_tensor *tin) {
  NEWT_CHECK(declaring(c, "newt_state_tensor"));
  if (!tin) return NEWT_ERR(NEWT_ERR_INVALID, "newt_state_tensor: the tensor is NULL");
  newt_tensor t;
  const newt_tensor d = NEWT_TENSOR_INIT;
  NEWT_CHECK(take(tin, tin->size, &d, &t, sizeof t, "newt_tensor"));
  NEWT_CHECK(check_name(t.name, NEWT_NAME_MAX, "newt_state_tensor"));
  if (strncmp(t.name, "newt.", 5) == 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_state_tensor: \"%s\": names beginning with \"newt.\" are newt's own", t.name);
  const char *nm = t.name;
  if ((unsigned)t.dtype > NEWT_U8) return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": type %d is not a newt_dtype", nm, (int)t.dtype);
  if (t.ndim < 1 || t.ndim > NEWT_MAX_DIMS || !t.shape)
    return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": %d dimensions (1 to %d, with a shape)", nm, t.ndim, NEWT_MAX_DIMS);
  if (t.flags & ~(NEWT_TENSOR_DEVICE | NEWT_TENSOR_DERIVED))
    return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": unknown flags 0x%x", nm, t.flags);
  if ((t.flags & NEWT_TENSOR_DEVICE) && c->device < 0 && c->o.memory.host_visible)
    return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": device memory, but this worker has no device", nm);
  if ((t.offset == NULL) != (t.extent == NULL))
    return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": give both offset and extent, or neither", nm);
  /* Every product and sum checked before it is made (the numbers are the program's): the
     whole tensor's bytes fit an int64_t, so the box, the part and its bytes do too. */
  const int64_t esize = (int64_t)newt_dtype_size(t.dtype);
  int64_t offset[NEWT_SLICE_MAX_DIMS] = {0}, extent[NEWT_SLICE_MAX_DIMS] = {0}, box = 1, whole = 1;
  for (int i = 0; i < t.ndim; i++) {
    if (t.shape[i] < 1) return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": shape[%d] is %lld", nm, i, (long long)t.shape[i]);
    if (whole > INT64_MAX / esize / t.shape[i])
      return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": shape[%d] %lld: the tensor's bytes (its shape's product times %lld) "
                      "overflow 64 bits", nm, i, (long long)t.shape[i], (long long)esize);
    whole *= t.shape[i];
    offset[i] = t.offset ? t.offset[i] : 0;
    extent[i] = t.extent ? t.extent[i] : t.shape[i];
    if (offset[i] < 0 || offset[i] >= t.shape[i])
      return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": offset[%d] %lld is not inside [0, %lld)", nm, i,
                      (long long)offset[i], (long long)t.shape[i]);
    if (extent[i] < 1 || extent[i] > t.shape[i] - offset[i])
      return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": extent[%d] %lld: the box from offset %lld is not inside [0, %lld)",
                      nm, i, (long long)extent[i], (long long)offset[i], (long long)t.shape[i]);
    box *= extent[i]; /* at most whole */
  }
  int64_t end = t.end ? t.end : box;
  if (t.begin < 0 || end > box || t.begin >= end)
    return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": begin and end: elements [%lld, %lld) of a box of %lld", nm,
                    (long long)t.begin, (long long)end, (long long)box);
  size_t want = (size_t)((end - t.begin) * esize);
  if (t.bytes != want)
    return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": its buffer has %zu bytes, its part %zu (%lld %s elements)", nm,
                    t.bytes, want, (long long)(end - t.begin), newt_dtype_name(t.dtype));
  if (!t.data) return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": data is NULL", nm);
  reshard_piece p;
  memset(&p, 0, sizeof p);
  snprintf(p.name, sizeof p.name, "%s", nm);
  p.dtype = t.dtype;
  p.flags = (t.flags & NEWT_TENSOR_DERIVED ? RESHARD_DERIVED : 0) | (t.flags & NEWT_TENSOR_DEVICE ? WORKER_PART_DEVICE : 0);
  p.ndim = t.ndim;
  for (int i = 0; i < t.ndim; i++) p.shape[i] = t.shape[i];
  newt_slice_box(&p.slice, t.ndim, offset, extent);
  p.slice.begin = t.begin;
  p.slice.end = end;
  p.data = t.data;
  return worker_declare(c, &p);
}

newt_result_t newt_state_bytes(newt_ctx *c, const char *name, newt_scope scope, void *buf, size_t len) {
  NEWT_CHECK(declaring(c, "newt_state_bytes"));
  NEWT_CHECK(check_name(name, 48, "newt_state_bytes"));
  if (scope != NEWT_PER_JOB && scope != NEWT_PER_RANK)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_state_bytes \"%s\": scope %d is not a newt_scope", name, (int)scope);
  if (!buf || len == 0) return NEWT_ERR(NEWT_ERR_INVALID, "newt_state_bytes \"%s\": %zu bytes at %p", name, len, buf);
  if (len > (size_t)INT64_MAX) /* a checkpoint's sizes are int64_t */
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_state_bytes \"%s\": len %zu is over %lld bytes", name, len, (long long)INT64_MAX);
  reshard_piece p;
  memset(&p, 0, sizeof p);
  if (scope == NEWT_PER_JOB) snprintf(p.name, sizeof p.name, "newt.job/%s", name);
  else snprintf(p.name, sizeof p.name, "newt.rank/%d/%s", c->me->rank, name);
  p.dtype = NEWT_U8;
  p.flags = scope == NEWT_PER_RANK ? RESHARD_OPTIONAL : 0;
  p.ndim = 1;
  p.shape[0] = (int64_t)len;
  int64_t zero = 0, n = (int64_t)len;
  newt_slice_box(&p.slice, 1, &zero, &n);
  p.data = buf;
  return worker_declare(c, &p);
}

newt_result_t newt_state_document(newt_ctx *c, newt_doc_write_fn write, newt_doc_check_fn check, void *arg) {
  CHECK_CTX(c, "newt_state_document");
  c->doc_write = write;
  c->doc_check = check;
  c->doc_arg = arg;
  return NEWT_OK;
}

newt_result_t newt_state_restore(newt_ctx *c, newt_restore_info *out) {
  CHECK_CTX(c, "newt_state_restore");
  if (c->phase != PHASE_BUILT)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_state_restore: %s", c->phase == PHASE_RUNNING
                                                                    ? "this generation is restored already"
                                                                    : "no generation (newt_step_begin says NEXT_GENERATION first)");
  if (out) NEWT_CHECK(writable(out, "newt_restore_info")); /* refused before anything is restored */
  newt_restore_info i = {.size = sizeof i};
  newt_result_t r = worker_restore(c, &i);
  if (r == NEWT_OK) worker_chaos_die(c);
  if (r == NEWT_OK) r = worker_restored(c);
  if (r != NEWT_OK) { /* kept: a step begun unrestored says it (and so the termination message) */
    snprintf(c->restore_err, sizeof c->restore_err, "%s", newt_errmsg());
    return r;
  }
  return out ? give(out, &i, sizeof i, "newt_restore_info") : NEWT_OK;
}

/* --- steps ------------------------------------------------------------------------------------ */

newt_result_t newt_step_begin(newt_ctx *c, newt_batch *b, newt_next *next) {
  CHECK_CTX(c, "newt_step_begin");
  if (!b || !next) return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_begin: the batch or next is NULL");
  NEWT_CHECK(writable(b, "newt_batch")); /* refused before a step or a generation is handed out */
  newt_batch full = {.size = sizeof full};
  newt_result_t r = worker_begin(c, &full, next);
  if (r != NEWT_OK) return r;
  return give(b, &full, sizeof full, "newt_batch");
}

newt_result_t newt_step_commit(newt_ctx *c, const double *values, double *sums, int n) {
  CHECK_CTX(c, "newt_step_commit");
  if (n < 0 || n > 32) return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_commit: %d values (0 to 32)", n);
  if (n > 0 && (!values || !sums)) return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_commit: values or sums is NULL");
  return worker_commit(c, values, sums, n);
}

newt_result_t newt_step_end(newt_ctx *c, const newt_step_result *rin) {
  CHECK_CTX(c, "newt_step_end");
  newt_step_result r = {.size = sizeof r};
  if (rin) NEWT_CHECK(take(rin, rin->size, NULL, &r, sizeof r, "newt_step_result"));
  return worker_end(c, &r);
}

void newt_leave(newt_ctx *c) {
  if (c) atomic_store(&c->leave_asked, 1);
}

int newt_finish(newt_ctx *c, newt_result_t r) {
  if (!c) return JOB_EXIT_ERROR;
  return worker_finish(c, r);
}

comm_t *worker_comm_of(newt_comm *c) { return c && c->magic == WORKER_COMM_MAGIC ? c->c : NULL; }

newt_result_t worker_end_job_now(newt_ctx *c) {
  if (!c) return NEWT_ERR(NEWT_ERR_INVALID, "worker_end_job_now: no worker");
  if (!c->spec.restart)
    return NEWT_ERR(NEWT_ERR_INVALID, "worker_end_job_now: job %s is not in the restart mode (spec.restart)", c->o.job);
  if (c->phase != PHASE_RUNNING || c->step != STEP_IDLE || c->live_step < 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "worker_end_job_now: only after a step's newt_step_end");
  c->end_now = 1;
  return NEWT_OK;
}

newt_result_t worker_fail_job(newt_ctx *c, const char *why) {
  if (!c || !why) return NEWT_ERR(NEWT_ERR_INVALID, "worker_fail_job: no worker or no reason");
  if (c->phase != PHASE_RUNNING)
    return NEWT_ERR(NEWT_ERR_INVALID, "worker_fail_job: only while a generation runs");
  NEWT_ERROR(WORKER, "%s: the job fails: %s", c->id, why);
  c->failed = 1;
  snprintf(c->failed_why, sizeof c->failed_why, "%s", why);
  worker_report_fatal(c, &c->plan, why);
  return NEWT_OK;
}
