/* What a device implementation provides behind model/dev.h: a table of operations, one per
 * public function, and the device object they share. dev.c is the public face (it checks
 * nothing the implementations check, and adds nothing but the dispatch); dev_cpu.c is the
 * CPU device; dev_cuda.c the CUDA device (built with NEWT_HAVE_CUDA). */
#ifndef NEWT_MODEL_DEV_INTERNAL_H
#define NEWT_MODEL_DEV_INTERNAL_H

#include "model/dev.h"

typedef struct model_dev_ops {
  void (*close)(model_dev *d);
  newt_result_t (*alloc)(model_dev *d, size_t bytes, void **out);
  void (*free)(model_dev *d, void *p);
  newt_result_t (*host_alloc)(model_dev *d, size_t bytes, void **out);
  void (*host_free)(model_dev *d, void *p);
  newt_result_t (*upload)(model_dev *d, void *dst, const void *src, size_t bytes);
  newt_result_t (*download)(model_dev *d, void *dst, const void *src, size_t bytes);
  void (*download_async)(model_dev *d, void *dst, const void *src, size_t bytes);
  void (*upload_async)(model_dev *d, void *dst, const void *src, size_t bytes);
  void (*copy)(model_dev *d, void *dst, const void *src, size_t bytes);
  void (*zero)(model_dev *d, void *p, size_t bytes);
  newt_result_t (*sync)(model_dev *d);
  size_t (*scratch_floats)(const model_dev *d, int T, int C, int NH);

  void (*encoder_forward)(model_dev *d, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                          int T, int C);
  void (*encoder_backward)(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                           int T, int C);
  void (*embed_rows_forward)(model_dev *d, float *out, const int32_t *inp, const float *wte, int BT, int C, int lo,
                             int Vl);
  void (*add_positions)(model_dev *d, float *x, const float *wpe, int B, int T, int C);
  void (*embed_rows_backward)(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                              int T, int C, int lo, int Vl);
  void (*layernorm_forward)(model_dev *d, float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int B, int T, int C);
  void (*layernorm_backward)(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean, const float *rstd, int B,
                             int T, int C, float *scratch);
  void (*matmul_forward)(model_dev *d, float *out, const float *res, const float *inp, const float *weight,
                         const float *bias, int B, int T, int C, int OC);
  void (*matmul_backward)(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int B, int T, int C, int OC);
  void (*attention_forward)(model_dev *d, float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                            float *scratch);
  void (*attention_backward)(model_dev *d, float *dqkv, const float *dout, const float *att, const float *qkv,
                             int B, int T, int C, int NH, float *scratch);
  void (*gelu_forward)(model_dev *d, float *out, const float *inp, size_t N);
  void (*gelu_backward)(model_dev *d, float *dinp, const float *inp, const float *dout, size_t N);
  void (*add_res_bias)(model_dev *d, float *out, const float *res, const float *bias, size_t BT, size_t C);
  void (*crossentropy)(model_dev *d, float *losses, float *dlogits, const float *logits, const int32_t *targets,
                       int B, int T, int V, float dscale, double *loss_acc);
  void (*ce_rowmax)(model_dev *d, float *mx, const float *logits, int BT, int Vl);
  void (*ce_partials)(model_dev *d, float *st, const float *logits, const float *mx, const int32_t *targets, int BT,
                      int Vl, int lo);
  void (*ce_finish)(model_dev *d, float *losses, float *logits, const float *mx, const float *st,
                    const int32_t *targets, int BT, int Vl, int lo, float dscale, double *loss_acc);
  void (*sqnorm)(model_dev *d, double *acc, const float *x, size_t n);
  void (*adamw)(model_dev *d, model_adamw *o, const model_layout *lay, float *params, const float *grads, double lr,
                float grad_scale);
} model_dev_ops;

struct model_dev {
  const model_dev_ops *ops;
  model_dev_kind kind;
  int ordinal;       /* GPU ordinal, -1 for the CPU */
  int host_visible;  /* device pointers are host memory */
  void *stream;      /* cudaStream_t (NULL: the CPU) */
  double peak_flops; /* dense bf16 FLOP/s, 0 when unknown */
  char name[128];
  newt_result_t err; /* the first error (sticky) */
  char errmsg[512];  /* its message */
  void *impl;        /* the implementation's own state */
};

/* Records the device's first error with the message in newt_errmsg() (later ones are
 * dropped); returns the first (dev_err.c). */
newt_result_t model_dev_fail(model_dev *d, newt_result_t r);

extern const model_dev_ops model_dev_cpu_ops;
/* The CUDA device's constructor (dev_cuda.c; NEWT_HAVE_CUDA only). */
newt_result_t model_dev_cuda_open(int ordinal, model_dev **out);

#endif
