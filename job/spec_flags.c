/* The spec's command-line flags (see spec_flags.h). A row names the spec field it sets by its
 * path; where it lives and what it holds come from the spec's own table (spec_field, the
 * job/codec.h descriptor), so the kind decides the flag's type and how its value is stored:
 *
 *   field kind                 flag           stored
 *   CODEC_K_INT                NEWT_OPT_INT   as it is (.size: NEWT_OPT_SIZE, 64K, 1G)
 *   CODEC_K_CUSTOM (a seed)    NEWT_OPT_INT   as a uint64_t; a negative value is refused
 *   CODEC_K_REAL               NEWT_OPT_DOUBLE as it is
 *   CODEC_K_BOOL               NEWT_OPT_FLAG  1 when given
 *   CODEC_K_ENUM               NEWT_OPT_STR   the index of the word; another is refused
 *   CODEC_K_STR                NEWT_OPT_STR   copied; one too long for the field is refused
 *   a section (model)          NEWT_OPT_STR   by the row's set
 *
 * The ranges and the rules between fields stay spec_validate's. */
#include "job/spec_flags.h"

#include <stdio.h>
#include <string.h>

#include "job/codec.h"

struct spec_flag {
  const char *flag; /* without "--" */
  const char *path; /* the spec field, as in its JSON */
  const char *help;
  int size;           /* an integer given as a size (NEWT_OPT_SIZE) */
  const char *expect; /* a string field: what a value too long is said to be expected as */
  /* in place of the store the kind makes: a field the kind does not describe */
  newt_result_t (*set)(const spec_flag *r, const spec_flag_value *v, newt_spec *s);
};

static newt_result_t set_model(const spec_flag *r, const spec_flag_value *v, newt_spec *s) {
  return spec_set_model(s, v->s) == NEWT_OK ? NEWT_OK : newt_err_wrap(NEWT_ERR_INVALID, "--%s: ", r->flag);
}

/* the peak rate, and the final one a tenth of it (--lr-min, where a command has it, after) */
static newt_result_t set_lr(const spec_flag *r, const spec_flag_value *v, newt_spec *s) {
  (void)r;
  s->lr = v->d;
  s->lr_min = v->d / 10;
  return NEWT_OK;
}

static newt_result_t set_lr_min(const spec_flag *r, const spec_flag_value *v, newt_spec *s) {
  (void)r;
  if (v->d >= 0) s->lr_min = v->d; /* -1: lr / 10 */
  return NEWT_OK;
}

/* In the order the values are applied: --lr before --lr-min. */
static const spec_flag rows[] = {
    {"job", "job", "job name"},
    {"preset", "model.preset", "model preset: tiny, small or gpt2-124m"},
    {"model", "model", "overrides of the preset: layers=2,channels=64,...", .set = set_model},
    {"steps", "train.steps", "optimizer steps"},
    {"seq-len", "train.seq_len", "tokens per sample (0: the model's ctx)"},
    {"global-batch", "train.global_batch", "samples per step, kept across every resize"},
    {"batch", "train.global_batch", "global batch, sequences per step"},
    {"micro-batch", "train.micro_batch", "samples per forward/backward on one rank"},
    {"lr", "train.lr", "peak learning rate", .set = set_lr},
    {"lr-min", "train.lr_min", "final learning rate of the cosine (-1: lr / 10)", .set = set_lr_min},
    {"warmup", "train.warmup", "warmup steps (-1: 5% of steps)"},
    {"weight-decay", "train.weight_decay", "AdamW weight decay on 2-D weights"},
    {"grad-clip", "train.grad_clip", "max global gradient norm (0: off)"},
    {"seed", "train.seed", "seed of the initial weights"},
    {"data", "data.path", "token file (newt data prepare); default: the generated corpus"},
    {"data-seed", "data.seed", "seed of the sample order"},
    {"gen-bytes", "data.gen_bytes", "length of the generated corpus without --data", .size = 1},
    {"ckpt-dir", "ckpt.dir", "checkpoint directory"},
    {"ckpt-every", "ckpt.every", "checkpoint every K steps (0: never)"},
    {"ckpt-keep", "ckpt.keep", "checkpoints to keep"},
    {"tp", "parallel.tp", "tensor-parallel size"},
    {"pp", "parallel.pp", "pipeline-parallel size"},
    {"zero", "parallel.zero", "ZeRO stage (0..3)"},
    {"dp-min", "parallel.dp_min", "smallest data-parallel size to train with"},
    {"dp-max", "parallel.dp_max", "largest data-parallel size"},
    {"join-window-ms", "parallel.join_window_ms",
     "joiners are taken in once no other has registered for this long (more gathers several into one plan)"},
    {"even-batches", "parallel.even_batches",
     "only data-parallel sizes that give every rank the same whole micro-batches (workers beyond wait as spares); "
     "default: every worker trains, the ranks splitting the global batch's samples as evenly as they go"},
    {"backend", "backend", "cpu, or nccl: the workers train on GPUs (one each), over NCCL", .expect = "cpu or nccl"},
    {"lease-ttl-ms", "fault.lease_ttl_ms", "worker and coordinator lease TTL"},
    {"comm-timeout-ms", "fault.comm_timeout_ms", "a collective without progress this long fails"},
    {"hang-timeout-ms", "fault.hang_timeout_ms", "no step progress this long is a hang"},
    {"first-step-timeout-ms", "fault.first_step_timeout_ms",
     "until the job's first step completed (start-up: the model, the data, CUDA), the hang deadline"},
    {"max-failures", "fault.max_failures",
     "the failure budget: more crash or hang recoveries than this in the window fail the job (0: none)"},
    {"failure-window-ms", "fault.failure_window_ms", "the failure budget's window"},
    {"progress-timeout-ms", "fault.progress_timeout_ms",
     "once the job has a plan, no step completed this long fails the job, naming what it waited for (0: wait for "
     "ever)"},
    {"replicas", "fault.replicas",
     "k: each data-parallel rank keeps copies of its k predecessors' ZeRO shards, in other failure domains, so any "
     "k domains lost at once recover from memory (1..8; spec.fault.replicas)"},
    {"on-state-loss", "fault.on_state_loss",
     "when no step is whole in the ranks' memory: checkpoint (back to the newest checkpoint; without one the job "
     "fails), fail, or restart (the newest checkpoint, else the initial state); spec.fault.on_state_loss"},
    {"verify-every", "fault.verify_every",
     "fingerprint the replicated state and compare it across data-parallel replicas every N steps (0: never)"},
    {"straggler-margin", "fault.straggler_margin",
     "a data-parallel rank whose compute stays this fraction above (or below) the median rank's is a straggler "
     "(or recovered)"},
    {"straggler-window", "fault.straggler_window",
     "... for this many steps in a row: the leader sets the ranks' shares of the global batch by their measured "
     "speeds (0: never)"},
    {"straggler-replace", "fault.straggler_replace",
     "a straggler this many times slower per sample than the median rank is replaced by an idle spare, where "
     "there is one, rather than given a smaller share (0: never)"},
    {"on-mismatch", "fault.on_mismatch",
     "when replicas disagree: rollback (to the newest step they agreed at), warn, or fail; spec.fault.on_mismatch"},
};
#define NROWS (sizeof rows / sizeof rows[0])

const char *spec_flag_row(size_t i, const char **path) {
  if (i >= NROWS) return NULL;
  *path = rows[i].path;
  return rows[i].flag;
}

static newt_opt_type type_of(const spec_flag *r, const codec_field *f) {
  switch (f->kind) {
    case CODEC_K_INT: return r->size ? NEWT_OPT_SIZE : NEWT_OPT_INT;
    case CODEC_K_CUSTOM: return NEWT_OPT_INT; /* a seed */
    case CODEC_K_REAL: return NEWT_OPT_DOUBLE;
    case CODEC_K_BOOL: return NEWT_OPT_FLAG;
    default: return NEWT_OPT_STR; /* ENUM, STR, a section */
  }
}

/* The field's value in s as the flag's slot holds it (what --help shows as the default). */
static spec_flag_value value_of(const codec_field *f, const newt_spec *s) {
  const char *at = (const char *)s + f->off;
  spec_flag_value v = {0};
  int e;
  switch (f->kind) {
    case CODEC_K_INT:
    case CODEC_K_CUSTOM: memcpy(&v.i, at, sizeof v.i); break; /* int64_t, or a seed's uint64_t */
    case CODEC_K_REAL: memcpy(&v.d, at, sizeof v.d); break;
    case CODEC_K_BOOL: memcpy(&v.b, at, sizeof v.b); break;
    case CODEC_K_ENUM:
      memcpy(&e, at, sizeof e);
      v.s = f->words[e];
      break;
    case CODEC_K_STR: v.s = at[0] ? at : NULL; break;
    default: break; /* a section: no default */
  }
  return v;
}

newt_result_t spec_flags_bind(spec_flags *sf, newt_opt *opts, const newt_spec *defaults) {
  sf->defaults = *defaults;
  sf->n = 0;
  for (newt_opt *o = opts; o->name; o++) {
    if (o->ptr) continue; /* the command's own */
    size_t i = 0;
    while (i < NROWS && strcmp(rows[i].flag, o->name) != 0) i++;
    const codec_field *f = i < NROWS ? spec_field(rows[i].path) : NULL;
    if (!f || sf->n >= SPEC_FLAGS_MAX)
      return NEWT_ERR(NEWT_ERR_INVALID, "--%s: %s", o->name, f ? "more spec flags than SPEC_FLAGS_MAX"
                                                                : "no spec field of that flag (job/spec_flags.c)");
    sf->bound[sf->n].row = &rows[i];
    sf->bound[sf->n].v = value_of(f, &sf->defaults);
    o->type = type_of(&rows[i], f);
    o->ptr = &sf->bound[sf->n].v;
    if (!o->help) o->help = rows[i].help;
    sf->n++;
  }
  return NEWT_OK;
}

/* "a, b or c" of a NULL-terminated list of words */
static void words_list(const char *const *words, char *out, size_t cap) {
  size_t n = 0, l = 0;
  while (words[n]) n++;
  out[0] = '\0';
  for (size_t i = 0; i < n && l < cap; i++) {
    l += (size_t)snprintf(out + l, cap - l, "%s%s", i == 0 ? "" : i + 1 == n ? " or " : ", ", words[i]);
  }
}

/* The store the field's kind makes (see the file's top). */
static newt_result_t store(const spec_flag *r, const codec_field *f, const spec_flag_value *v, newt_spec *s) {
  char *at = (char *)s + f->off;
  switch (f->kind) {
    case CODEC_K_INT: memcpy(at, &v->i, sizeof v->i); return NEWT_OK;
    case CODEC_K_CUSTOM: {
      if (v->i < 0)
        return NEWT_ERR(NEWT_ERR_INVALID, "--%s: must not be negative, got %lld", r->flag, (long long)v->i);
      uint64_t u = (uint64_t)v->i;
      memcpy(at, &u, sizeof u);
      return NEWT_OK;
    }
    case CODEC_K_REAL: memcpy(at, &v->d, sizeof v->d); return NEWT_OK;
    case CODEC_K_BOOL: memcpy(at, &v->b, sizeof v->b); return NEWT_OK;
    case CODEC_K_ENUM: {
      int e = -1;
      for (int k = 0; v->s && f->words[k] && e < 0; k++)
        if (strcmp(f->words[k], v->s) == 0) e = k;
      if (e < 0) {
        char expect[128];
        words_list(f->words, expect, sizeof expect);
        return NEWT_ERR(NEWT_ERR_INVALID, "--%s: expected %s, got \"%s\"", r->flag, expect, v->s ? v->s : "");
      }
      memcpy(at, &e, sizeof e);
      return NEWT_OK;
    }
    case CODEC_K_STR: {
      const char *t = v->s ? v->s : "";
      if (strlen(t) >= f->size) {
        if (r->expect) return NEWT_ERR(NEWT_ERR_INVALID, "--%s: %s, got \"%s\"", r->flag, r->expect, t);
        return NEWT_ERR(NEWT_ERR_INVALID, "--%s: at most %zu characters, got %zu", r->flag, f->size - 1, strlen(t));
      }
      memcpy(at, t, strlen(t) + 1);
      return NEWT_OK;
    }
    default: return NEWT_ERR(NEWT_ERR_INVALID, "--%s: spec.%s has no store of its own", r->flag, r->path);
  }
}

newt_result_t spec_flags_apply(const spec_flags *sf, newt_spec *s) {
  for (size_t i = 0; i < NROWS; i++)
    for (size_t k = 0; k < sf->n; k++) {
      const spec_flag *r = sf->bound[k].row;
      if (r != &rows[i]) continue;
      NEWT_CHECK(r->set ? r->set(r, &sf->bound[k].v, s) : store(r, spec_field(r->path), &sf->bound[k].v, s));
    }
  return NEWT_OK;
}

size_t spec_flags_given(const spec_flags *sf, int end, char **argv, char *given, size_t cap) {
  size_t n = 0, l = 0;
  given[0] = '\0';
  for (int i = 0; i < end; i++) {
    if (strncmp(argv[i], "--", 2) != 0) continue;
    for (size_t k = 0; k < sf->n; k++) {
      const char *name = sf->bound[k].row->flag;
      size_t len = strlen(name);
      if (strncmp(argv[i] + 2, name, len) != 0 || (argv[i][2 + len] != '\0' && argv[i][2 + len] != '=')) continue;
      if (l < cap) l += (size_t)snprintf(given + l, cap - l, "%s--%s", n ? ", " : "", name);
      n++;
    }
  }
  return n;
}
