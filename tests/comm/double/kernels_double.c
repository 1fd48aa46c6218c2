/* The double of newt's CUDA kernels (model/cuda/kernels.h; tests only, never linked into the
 * shipped newt): every launcher queues, on its context's stream of the CUDA runtime double
 * (double.h), work that runs the CPU device's op of model/dev.h on the double's "device
 * memory" (host memory). So a newt built against the double (NEWT_GPU_DOUBLE) runs the CUDA
 * device (model/dev_cuda.c) and the NCCL backend exactly as on a GPU -- launches that
 * return before their work ran, collectives ordered after them on the same stream, errors
 * seen at the next synchronisation -- with the CPU kernels' numbers.
 *
 * What it follows of the real launchers (kernels.h): they only enqueue, never wait, and
 * a context's work runs in launch order; the host's model_adamw is advanced (o->t) at
 * launch, the step the queued update uses is the one it had then. What it does not model:
 * the bf16 rounding of the GEMMs (the CPU ops are fp32), and kernels running concurrently
 * with the host beyond what one stream thread gives. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "double.h"
#include "model/cuda/kernels.h"
#include "model/dev.h"
#include "model/ops.h"

struct model_cuda_kernels {
  cudaStream_t stream;
  float *scratch; /* the CPU ops' per-thread scratch, used by the stream's thread only */
  size_t scratch_floats;
};

typedef enum op {
  ENCODER_FWD,
  ENCODER_BWD,
  EMBED_ROWS_FWD,
  ADD_POSITIONS,
  EMBED_ROWS_BWD,
  LAYERNORM_FWD,
  LAYERNORM_BWD,
  MATMUL_FWD,
  MATMUL_BWD,
  ATTENTION_FWD,
  ATTENTION_BWD,
  GELU_FWD,
  GELU_BWD,
  ADD_RES_BIAS,
  CROSSENTROPY,
  CE_ROWMAX,
  CE_PARTIALS,
  CE_FINISH,
  SQNORM,
  ADAMW
} op;

/* One launch: the op and its arguments as given (pointers are device memory but for lay). */
typedef struct kwork {
  dbl_work w;
  model_cuda_kernels *k;
  op op;
  void *p[9];
  int i[7];
  size_t n[2];
  float f;
  double lr;
  model_adamw o;
  const model_layout *lay;
} kwork;

/* The CPU ops' scratch for sizes T, C, NH (grown on the stream's thread). */
static float *scratch(model_cuda_kernels *k, int T, int C, int NH) {
  size_t need = (size_t)model_threads_get() * model_dev_scratch_floats(model_dev_cpu(), T, C, NH);
  if (need > k->scratch_floats) {
    free(k->scratch);
    k->scratch = calloc(need, sizeof(float));
    k->scratch_floats = k->scratch ? need : 0;
  }
  return k->scratch;
}

static void run(dbl_work *w) {
  kwork *q = (kwork *)w;
  /* the stream's thread runs the ops with the team the process set (model_threads_set sets
     it for its calling thread only), which the scratch is sized for */
  if (omp_get_max_threads() != model_threads_get()) omp_set_num_threads(model_threads_get());
  model_dev *d = model_dev_cpu();
  void **p = q->p;
  int *i = q->i;
  switch (q->op) {
  case ENCODER_FWD: model_k_encoder_forward(d, p[0], p[1], p[2], p[3], i[0], i[1], i[2]); break;
  case ENCODER_BWD: model_k_encoder_backward(d, p[0], p[1], p[2], p[3], i[0], i[1], i[2]); break;
  case EMBED_ROWS_FWD: model_k_embed_rows_forward(d, p[0], p[1], p[2], i[0], i[1], i[2], i[3]); break;
  case ADD_POSITIONS: model_k_add_positions(d, p[0], p[1], i[0], i[1], i[2]); break;
  case EMBED_ROWS_BWD: model_k_embed_rows_backward(d, p[0], p[1], p[2], p[3], i[0], i[1], i[2], i[3], i[4]); break;
  case LAYERNORM_FWD: model_k_layernorm_forward(d, p[0], p[1], p[2], p[3], p[4], p[5], i[0], i[1], i[2]); break;
  case LAYERNORM_BWD:
    model_k_layernorm_backward(d, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], i[0], i[1], i[2],
                               scratch(q->k, i[1], i[2], 1));
    break;
  case MATMUL_FWD: model_k_matmul_forward(d, p[0], p[1], p[2], p[3], p[4], i[0], i[1], i[2], i[3]); break;
  case MATMUL_BWD: model_k_matmul_backward(d, p[0], p[1], p[2], p[3], p[4], p[5], i[0], i[1], i[2], i[3]); break;
  case ATTENTION_FWD:
    model_k_attention_forward(d, p[0], p[1], p[2], i[0], i[1], i[2], i[3], scratch(q->k, i[1], i[2], i[3]));
    break;
  case ATTENTION_BWD:
    model_k_attention_backward(d, p[0], p[1], p[2], p[3], i[0], i[1], i[2], i[3], scratch(q->k, i[1], i[2], i[3]));
    break;
  case GELU_FWD: model_k_gelu_forward(d, p[0], p[1], q->n[0]); break;
  case GELU_BWD: model_k_gelu_backward(d, p[0], p[1], p[2], q->n[0]); break;
  case ADD_RES_BIAS: model_k_add_res_bias(d, p[0], p[1], p[2], q->n[0], q->n[1]); break;
  case CROSSENTROPY: model_k_crossentropy(d, p[0], p[1], p[2], p[3], i[0], i[1], i[2], q->f, p[4]); break;
  case CE_ROWMAX: model_k_ce_rowmax(d, p[0], p[1], i[0], i[1]); break;
  case CE_PARTIALS: model_k_ce_partials(d, p[0], p[1], p[2], p[3], i[0], i[1], i[2]); break;
  case CE_FINISH: model_k_ce_finish(d, p[0], p[1], p[2], p[3], p[4], i[0], i[1], i[2], q->f, p[5]); break;
  case SQNORM: model_k_sqnorm(d, p[0], p[1], q->n[0]); break;
  case ADAMW: model_k_adamw(d, &q->o, q->lay, p[0], p[1], q->lr, q->f); break;
  }
}

static void release(dbl_work *w) { free(w); }

static kwork *work(model_cuda_kernels *k, op o) {
  kwork *q = calloc(1, sizeof *q);
  if (q) *q = (kwork){.w = {.run = run, .release = release}, .k = k, .op = o};
  return q;
}

static newt_result_t launch(kwork *q, const char *what) {
  if (!q) return NEWT_ERR(NEWT_ERR_NOMEM, "%s: out of host memory for the launch", what);
  cudaError_t e = dbl_stream_push(q->k->stream, &q->w);
  if (e != cudaSuccess) {
    free(q);
    return NEWT_ERR(NEWT_ERR_CUDA, "%s: the launch was refused (%s)", what, cudaGetErrorString(e));
  }
  return NEWT_OK;
}

/* Set a kwork's pointer and int arguments from the lists given (expressions). */
static void set_ptrs(kwork *q, const void *const *v, size_t n) {
  for (size_t j = 0; j < n; j++) q->p[j] = (void *)v[j];
}
static void set_ints(kwork *q, const int *v, size_t n) { memcpy(q->i, v, n * sizeof *v); }
#define PTRS(q, ...)                                                                                                   \
  set_ptrs((q), (const void *const[]){__VA_ARGS__}, sizeof((const void *const[]){__VA_ARGS__}) / sizeof(void *))
#define INTS(q, ...) set_ints((q), (const int[]){__VA_ARGS__}, sizeof((const int[]){__VA_ARGS__}) / sizeof(int))

newt_result_t model_cuda_kernels_init(void *stream, model_cuda_kernels **out) {
  model_cuda_kernels *k = calloc(1, sizeof *k);
  if (!k) return NEWT_ERR(NEWT_ERR_NOMEM, "kernels: out of host memory");
  k->stream = stream;
  *out = k;
  return NEWT_OK;
}

void model_cuda_kernels_free(model_cuda_kernels *k) {
  if (!k) return;
  cudaStreamSynchronize(k->stream);
  free(k->scratch);
  free(k);
}

newt_result_t model_cuda_encoder_forward(model_cuda_kernels *k, float *out, const int32_t *inp, const float *wte,
                                         const float *wpe, int B, int T, int C) {
  kwork *q = work(k, ENCODER_FWD);
  if (q) PTRS(q, out, inp, wte, wpe), INTS(q, B, T, C);
  return launch(q, "encoder_forward");
}

newt_result_t model_cuda_encoder_backward(model_cuda_kernels *k, float *dwte, float *dwpe, const float *dout,
                                          const int32_t *inp, int B, int T, int C) {
  kwork *q = work(k, ENCODER_BWD);
  if (q) PTRS(q, dwte, dwpe, dout, inp), INTS(q, B, T, C);
  return launch(q, "encoder_backward");
}

newt_result_t model_cuda_embed_rows_forward(model_cuda_kernels *k, float *out, const int32_t *inp, const float *wte,
                                            int BT, int C, int lo, int Vl) {
  kwork *q = work(k, EMBED_ROWS_FWD);
  if (q) PTRS(q, out, inp, wte), INTS(q, BT, C, lo, Vl);
  return launch(q, "embed_rows_forward");
}

newt_result_t model_cuda_add_positions(model_cuda_kernels *k, float *x, const float *wpe, int B, int T, int C) {
  kwork *q = work(k, ADD_POSITIONS);
  if (q) PTRS(q, x, wpe), INTS(q, B, T, C);
  return launch(q, "add_positions");
}

newt_result_t model_cuda_embed_rows_backward(model_cuda_kernels *k, float *dwte, float *dwpe, const float *dout,
                                             const int32_t *inp, int B, int T, int C, int lo, int Vl) {
  kwork *q = work(k, EMBED_ROWS_BWD);
  if (q) PTRS(q, dwte, dwpe, dout, inp), INTS(q, B, T, C, lo, Vl);
  return launch(q, "embed_rows_backward");
}

newt_result_t model_cuda_layernorm_forward(model_cuda_kernels *k, float *out, float *mean, float *rstd,
                                           const float *inp, const float *weight, const float *bias, int B, int T,
                                           int C) {
  kwork *q = work(k, LAYERNORM_FWD);
  if (q) PTRS(q, out, mean, rstd, inp, weight, bias), INTS(q, B, T, C);
  return launch(q, "layernorm_forward");
}

newt_result_t model_cuda_layernorm_backward(model_cuda_kernels *k, float *dinp, float *dweight, float *dbias,
                                            const float *dout, const float *inp, const float *weight,
                                            const float *mean, const float *rstd, int B, int T, int C) {
  kwork *q = work(k, LAYERNORM_BWD);
  if (q) PTRS(q, dinp, dweight, dbias, dout, inp, weight, mean, rstd), INTS(q, B, T, C);
  return launch(q, "layernorm_backward");
}

newt_result_t model_cuda_matmul_forward(model_cuda_kernels *k, float *out, const float *res, const float *inp,
                                        const float *weight, const float *bias, int B, int T, int C, int OC) {
  kwork *q = work(k, MATMUL_FWD);
  if (q) PTRS(q, out, res, inp, weight, bias), INTS(q, B, T, C, OC);
  return launch(q, "matmul_forward");
}

newt_result_t model_cuda_matmul_backward(model_cuda_kernels *k, float *dinp, float *dweight, float *dbias,
                                         const float *dout, const float *inp, const float *weight, int B, int T,
                                         int C, int OC) {
  kwork *q = work(k, MATMUL_BWD);
  if (q) PTRS(q, dinp, dweight, dbias, dout, inp, weight), INTS(q, B, T, C, OC);
  return launch(q, "matmul_backward");
}

newt_result_t model_cuda_attention_forward(model_cuda_kernels *k, float *out, float *att, const float *qkv, int B,
                                           int T, int C, int NH) {
  kwork *q = work(k, ATTENTION_FWD);
  if (q) PTRS(q, out, att, qkv), INTS(q, B, T, C, NH);
  return launch(q, "attention_forward");
}

newt_result_t model_cuda_attention_backward(model_cuda_kernels *k, float *dqkv, const float *dout, const float *att,
                                            const float *qkv, int B, int T, int C, int NH) {
  kwork *q = work(k, ATTENTION_BWD);
  if (q) PTRS(q, dqkv, dout, att, qkv), INTS(q, B, T, C, NH);
  return launch(q, "attention_backward");
}

newt_result_t model_cuda_gelu_forward(model_cuda_kernels *k, float *out, const float *inp, size_t N) {
  kwork *q = work(k, GELU_FWD);
  if (q) PTRS(q, out, inp), q->n[0] = N;
  return launch(q, "gelu_forward");
}

newt_result_t model_cuda_gelu_backward(model_cuda_kernels *k, float *dinp, const float *inp, const float *dout,
                                       size_t N) {
  kwork *q = work(k, GELU_BWD);
  if (q) PTRS(q, dinp, inp, dout), q->n[0] = N;
  return launch(q, "gelu_backward");
}

newt_result_t model_cuda_add_res_bias(model_cuda_kernels *k, float *out, const float *res, const float *bias,
                                      size_t BT, size_t C) {
  kwork *q = work(k, ADD_RES_BIAS);
  if (q) PTRS(q, out, res, bias), q->n[0] = BT, q->n[1] = C;
  return launch(q, "add_res_bias");
}

newt_result_t model_cuda_crossentropy(model_cuda_kernels *k, float *losses, float *dlogits, const float *logits,
                                      const int32_t *targets, int B, int T, int V, float dscale, double *loss_acc) {
  kwork *q = work(k, CROSSENTROPY);
  if (q) PTRS(q, losses, dlogits, logits, targets, loss_acc), INTS(q, B, T, V), q->f = dscale;
  return launch(q, "crossentropy");
}

newt_result_t model_cuda_ce_rowmax(model_cuda_kernels *k, float *mx, const float *logits, int BT, int Vl) {
  kwork *q = work(k, CE_ROWMAX);
  if (q) PTRS(q, mx, logits), INTS(q, BT, Vl);
  return launch(q, "ce_rowmax");
}

newt_result_t model_cuda_ce_partials(model_cuda_kernels *k, float *st, const float *logits, const float *mx,
                                     const int32_t *targets, int BT, int Vl, int lo) {
  kwork *q = work(k, CE_PARTIALS);
  if (q) PTRS(q, st, logits, mx, targets), INTS(q, BT, Vl, lo);
  return launch(q, "ce_partials");
}

newt_result_t model_cuda_ce_finish(model_cuda_kernels *k, float *losses, float *logits, const float *mx,
                                   const float *st, const int32_t *targets, int BT, int Vl, int lo, float dscale,
                                   double *loss_acc) {
  kwork *q = work(k, CE_FINISH);
  if (q) PTRS(q, losses, logits, mx, st, targets, loss_acc), INTS(q, BT, Vl, lo), q->f = dscale;
  return launch(q, "ce_finish");
}

newt_result_t model_cuda_sqnorm(model_cuda_kernels *k, double *acc, const float *x, size_t n) {
  kwork *q = work(k, SQNORM);
  if (q) PTRS(q, acc, x), q->n[0] = n;
  return launch(q, "sqnorm");
}

newt_result_t model_cuda_adamw_update(model_cuda_kernels *k, model_adamw *o, const model_layout *lay, float *params,
                                      const float *grads, double lr, float grad_scale) {
  kwork *q = work(k, ADAMW);
  if (q) PTRS(q, params, grads), q->o = *o, q->lay = lay, q->lr = lr, q->f = grad_scale;
  newt_result_t r = launch(q, "adamw_update");
  if (r == NEWT_OK) o->t++; /* as the op does, at launch: the host's count is the step's */
  return r;
}
