/* The parts of comm/ that need no peers: the reduction kernels against scalar loops
 * (every type and op, odd lengths, in place and not, bf16 rounding and NaN), argument
 * checks whose errors name the bad field, a communicator of one rank, and the NCCL
 * backend's answer where it cannot run (not built: NEWT_ERR_UNSUPPORTED; built but no
 * GPU: an error, not a crash). */
#include <math.h>

#include "comm/comm.h"
#include "comm/reduce.h"
#include "comm_test.h"
#include "common/dtype.h"
#include "test.h"

/* What one element of the kernel must be, computed the plain way. */
static double expect(newt_dtype dt, comm_op op, double x, double y, int div) {
  double r;
  if (op == COMM_MAX) r = x > y ? x : y;
  else if (dt == NEWT_F32 || dt == NEWT_BF16) r = div > 0 ? (double)(((float)x + (float)y) / (float)div) : (double)((float)x + (float)y);
  else if (dt == NEWT_U8) r = (double)(uint8_t)((uint8_t)((int)x + (int)y) / (div > 0 ? div : 1));
  else r = (double)((int64_t)(x + y) / (div > 0 ? div : 1));
  uint64_t t = 0;
  ct_set_elem(dt, &t, 0, r);
  return ct_get_elem(dt, &t, 0);
}

static void test_kernels(void) {
  const newt_dtype types[] = {NEWT_F32, NEWT_BF16, NEWT_I32, NEWT_I64, NEWT_U8};
  const comm_op ops[] = {COMM_SUM, COMM_MAX};
  const size_t lens[] = {0, 1, 3, 7, 16, 33, 1000, 4097};
  for (size_t t = 0; t < 5; t++) {
    newt_dtype dt = types[t];
    T_CHECK(comm_reduce_supported(dt));
    size_t es = newt_dtype_size(dt);
    for (size_t o = 0; o < 2; o++)
      for (int div = 0; div <= 3; div += 3) {
        if (ops[o] == COMM_MAX && div) continue;
        for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
          size_t n = lens[l];
          unsigned char *a = malloc(n * es + 1), *b = malloc(n * es + 1), *d = malloc(n * es + 1),
                        *ip = malloc(n * es + 1);
          for (size_t i = 0; i < n; i++) {
            double x = dt == NEWT_U8 ? (double)(i * 7 % 100) : ((double)(i % 23) - 11) * (dt == NEWT_F32 || dt == NEWT_BF16 ? 0.37 : 1);
            double y = dt == NEWT_U8 ? (double)(i * 3 % 120) : ((double)(i % 17) - 8) * (dt == NEWT_F32 || dt == NEWT_BF16 ? 1.3 : 1);
            ct_set_elem(dt, a, i, x);
            ct_set_elem(dt, b, i, y);
          }
          memcpy(ip, a, n * es);
          comm_reduce(dt, ops[o], d, a, b, n, div);
          comm_reduce(dt, ops[o], ip, NULL, b, n, div);
          size_t bad = 0;
          for (size_t i = 0; i < n; i++) {
            double e = expect(dt, ops[o], ct_get_elem(dt, a, i), ct_get_elem(dt, b, i), div);
            bad += ct_get_elem(dt, d, i) != e || ct_get_elem(dt, ip, i) != e;
          }
          T_CHECK_MSG(bad == 0, "%s %s div %d length %zu: %zu wrong", newt_dtype_name(dt),
                      ops[o] == COMM_SUM ? "sum" : "max", div, n, bad);
          free(a);
          free(b);
          free(d);
          free(ip);
        }
      }
  }
  T_CHECK(!comm_reduce_supported(NEWT_F16));
}

static void test_bf16_special(void) {
  uint16_t a[4] = {newt_f32_to_bf16(1.0f), newt_f32_to_bf16(NAN), newt_f32_to_bf16(INFINITY), newt_f32_to_bf16(256.0f)};
  uint16_t b[4] = {newt_f32_to_bf16(1.0f / 512), newt_f32_to_bf16(2.0f), newt_f32_to_bf16(1.0f), newt_f32_to_bf16(1.0f)};
  uint16_t d[4];
  comm_reduce(NEWT_BF16, COMM_SUM, d, a, b, 4, 0);
  T_CHECK(newt_bf16_to_f32(d[0]) == 1.0f); /* 1 + 2^-9 rounds to 1 */
  T_CHECK(isnan(newt_bf16_to_f32(d[1])));
  T_CHECK(isinf(newt_bf16_to_f32(d[2])));
  T_CHECK(newt_bf16_to_f32(d[3]) == 256.0f); /* 257 is not a bf16: ties to even */
  comm_reduce(NEWT_BF16, COMM_MAX, d, b, a, 4, 0);
  T_CHECK(isnan(newt_bf16_to_f32(d[1]))); /* a NaN on either side stays */
  float fa[2] = {NAN, 1}, fb[2] = {1, NAN}, fd[2];
  comm_reduce(NEWT_F32, COMM_MAX, fd, fa, fb, 2, 0);
  T_CHECK(isnan(fd[0]) && isnan(fd[1]));
}

static void test_config_errors(void) {
  ct_world w;
  ct_world_init(&w, 2, CT_SHM, "api");
  comm_config cfg;
  comm_t *c = (comm_t *)0x1;
  ct_config(&w, 0, &cfg);
  cfg.rank = 2;
  T_ERR(NEWT_ERR_INVALID, comm_create(&cfg, &c));
  T_CHECK(c == NULL && strstr(newt_errmsg(), "rank 2 of size 2"));
  ct_config(&w, 0, &cfg);
  cfg.timeout_ms = 0;
  T_ERR(NEWT_ERR_INVALID, comm_create(&cfg, &c));
  T_CHECK(strstr(newt_errmsg(), "timeout_ms"));
  ct_config(&w, 0, &cfg);
  cfg.secret_len = 4;
  T_ERR(NEWT_ERR_INVALID, comm_create(&cfg, &c));
  T_CHECK(strstr(newt_errmsg(), "secret_len"));
  ct_config(&w, 0, &cfg);
  const char *addrs[2] = {w.addrs[0], NULL};
  cfg.addrs = addrs;
  T_ERR(NEWT_ERR_INVALID, comm_create(&cfg, &c));
  T_CHECK(strstr(newt_errmsg(), "addrs[1]"));
  const char *same[2] = {w.addrs[0], w.addrs[0]};
  cfg.addrs = same;
  T_ERR(NEWT_ERR_INVALID, comm_create(&cfg, &c));
  T_CHECK(strstr(newt_errmsg(), "addrs[0] and addrs[1]"));
  const char *bad[2] = {"no-port", w.addrs[1]};
  cfg.addrs = bad;
  cfg.timeout_ms = 200;
  T_ERR(NEWT_ERR_INVALID, comm_create(&cfg, &c));
  T_CHECK(strstr(newt_errmsg(), "no-port"));
  /* a peer that never comes: the build times out naming it */
  ct_config(&w, 0, &cfg);
  cfg.timeout_ms = 300;
  T_ERR(NEWT_ERR_TIMEOUT, comm_create(&cfg, &c));
  T_CHECK_MSG(strstr(newt_errmsg(), "rank 1") && strstr(newt_errmsg(), w.addrs[1]), "%s", newt_errmsg());
  T_CHECK(ct_shm_count(w.job) == 0);
  ct_config(&w, 1, &cfg);
  cfg.timeout_ms = 300;
  T_ERR(NEWT_ERR_TIMEOUT, comm_create(&cfg, &c));
  T_CHECK_MSG(strstr(newt_errmsg(), "rank 0"), "%s", newt_errmsg());
  ct_world_free(&w);
}

static void test_single_rank(void) {
  ct_world w;
  ct_world_init(&w, 1, CT_SHM, "one");
  comm_config cfg;
  ct_config(&w, 0, &cfg);
  int fds = ct_fd_count(), threads = ct_thread_count();
  comm_t *c = NULL;
  T_OK(comm_create(&cfg, &c));
  T_CHECK(comm_rank(c) == 0 && comm_size(c) == 1 && comm_get_backend(c) == COMM_BACKEND_CPU);
  float x[5] = {1, 2, 3, 4, 5}, y[5] = {0};
  T_OK(comm_allreduce(c, x, y, 5, NEWT_F32, COMM_AVG));
  T_CHECK(y[4] == 5);
  T_OK(comm_reduce_scatter(c, x, y, 5, NEWT_F32, COMM_SUM));
  T_OK(comm_allgather(c, x, y, 5, NEWT_F32));
  T_OK(comm_broadcast(c, x, y, 5, NEWT_F32, 0));
  T_OK(comm_barrier(c));
  comm_req_t *r = NULL;
  T_OK(comm_allreduce_async(c, x, y, 5, NEWT_F32, COMM_SUM, &r));
  T_OK(comm_wait(r));
  /* argument errors name the argument */
  T_ERR(NEWT_ERR_INVALID, comm_broadcast(c, x, y, 5, NEWT_F32, 3));
  T_CHECK(strstr(newt_errmsg(), "root 3"));
  T_ERR(NEWT_ERR_INVALID, comm_send(c, x, 5, NEWT_F32, 0));
  T_CHECK(strstr(newt_errmsg(), "peer 0"));
  T_ERR(NEWT_ERR_INVALID, comm_allreduce(c, NULL, y, 5, NEWT_F32, COMM_SUM));
  T_ERR(NEWT_ERR_INVALID, comm_allreduce(c, x, y, 5, NEWT_F32, (comm_op)9));
  T_ERR(NEWT_ERR_INVALID, comm_allreduce(c, x, y, 5, (newt_dtype)42, COMM_SUM));
  T_ERR(NEWT_ERR_UNSUPPORTED, comm_allreduce(c, x, y, 2, NEWT_F16, COMM_SUM));
  T_ERR(NEWT_ERR_INVALID, comm_allreduce(c, x, y, SIZE_MAX / 2, NEWT_F32, COMM_SUM));
  T_OK(comm_allreduce(c, NULL, NULL, 0, NEWT_F32, COMM_SUM)); /* zero elements: nothing to do */
  /* abort: everything after fails at once */
  comm_abort(c);
  T_ERR(NEWT_ERR_ABORTED, comm_allreduce(c, x, y, 5, NEWT_F32, COMM_SUM));
  T_ERR(NEWT_ERR_ABORTED, comm_allreduce_async(c, x, y, 5, NEWT_F32, COMM_SUM, &r));
  comm_status st;
  comm_get_status(c, &st);
  T_CHECK(st.code == NEWT_ERR_ABORTED && st.peer == -1);
  comm_free(c);
  comm_free(NULL);
  T_CHECK(ct_threads_back_to(threads) == threads && ct_fd_count() == fds);
  ct_world_free(&w);
}

static void test_nccl_where_it_cannot_run(void) {
  ct_world w;
  ct_world_init(&w, 1, CT_TCP, "apinccl");
  comm_config cfg;
  ct_config(&w, 0, &cfg);
  cfg.backend = COMM_BACKEND_NCCL;
  cfg.timeout_ms = 2000;
  comm_t *c = NULL;
  int fds = ct_fd_count();
#ifndef NEWT_HAVE_CUDA
  T_ERR(NEWT_ERR_UNSUPPORTED, comm_create(&cfg, &c));
  T_CHECK(strstr(newt_errmsg(), "NCCL backend is not built"));
#else
  /* the NCCL backend takes the CPU backend's configuration (its control channel) */
  comm_config bad = cfg;
  bad.addrs = NULL;
  T_ERR(NEWT_ERR_INVALID, comm_create(&bad, &c));
  T_CHECK(strstr(newt_errmsg(), "addrs"));
  bad = cfg;
  bad.device = -1;
  T_ERR(NEWT_ERR_INVALID, comm_create(&bad, &c));
  T_CHECK(strstr(newt_errmsg(), "comm_config.device"));
  /* built with CUDA: on a machine without a GPU this must fail cleanly */
  if (getenv("NEWT_TEST_HAVE_GPU") == NULL) {
    newt_result_t r = comm_create(&cfg, &c);
    if (r == NEWT_OK) {
      comm_free(c); /* there is a GPU after all: the gpu tests cover it */
    } else {
      T_CHECK(r == NEWT_ERR_CUDA || r == NEWT_ERR_NCCL || r == NEWT_ERR_NOTFOUND); /* NOTFOUND: no libnccl.so.2 */
      T_CHECK(c == NULL);
    }
  }
#endif
  T_CHECK(ct_fd_count() == fds);
  ct_world_free(&w);
}

int main(void) {
  T_RUN(test_kernels);
  T_RUN(test_bf16_special);
  T_RUN(test_config_errors);
  T_RUN(test_single_rank);
  T_RUN(test_nccl_where_it_cannot_run);
  return T_DONE();
}
