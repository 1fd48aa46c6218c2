/* newt bench parse: what reading outside data costs as it grows (issue 37, item 11), one JSON
 * line per case.
 *
 *   newt bench parse [--ranks 17500,100000] [--events 40000] [--manifest-mb 8] [--repeat R]
 *
 *   plan      a plan of N ranks (dp N) as JSON, read back by plan_from_json (every watcher
 *             did it at every put of the plan): parse_ms, the median of R reads.
 *   plan_shards  the same plan in shards of 2048 ranks, as a plan of more ranks is stored: a
 *             host's read (the head and its own shard: host_ms) and the whole plan (the head
 *             and every shard: whole_ms), with the head's and the largest shard's bytes.
 *   events    N event records decoded and taken into a job_view, as `newt status` does with
 *             a snapshot (order "key": etcd lists them so) and as a watcher does when they
 *             come one at a time newest key first (order "reverse"): view_ms.
 *   manifest  a MANIFEST of about --manifest-mb MiB (under the 8 MiB bound) inspected by
 *             ckpt_inspect (`newt ckpt inspect`), in a child process: inspect_ms and
 *             peak_rss_mb, the child's peak resident memory above what it had before; for
 *             three shapes: many one-chunk tensors ("tensors"), one tensor of many chunks
 *             ("chunks"), one of many 8-dimensional chunks ("boxes8").
 *
 * Each case checks what it read (the ranks, the events kept, the tensors and chunks) and the
 * command exits 1 when one is wrong: the test bench_parse runs it small for that. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "bench/bench.h"
#include "ckpt/ckpt.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/opts.h"
#include "common/strutil.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/view.h"

static double ms_since(uint64_t t0) { return (double)(newt_now_ns() - t0) / 1e6; }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* --- a plan of n ranks ------------------------------------------------------------------------ */

/* The same plan in shards of 2048 ranks (job_plan_publish_plan's): a host's read, the head and
 * the shard of its host (host_ms: what a worker needs for its own rank and its host's), and
 * the whole plan from the head and every shard (whole_ms), medians of R reads. */
static int bench_plan_shards(const newt_plan *p, int repeat) {
  char *head, **texts;
  int ns, bad = 0;
  if (plan_shard_encode(p, 2048, &head, &texts, &ns) != NEWT_OK) {
    fprintf(stderr, "newt bench parse: plan in shards: %s\n", newt_errmsg());
    return 1;
  }
  double *th = calloc((size_t)repeat, sizeof *th), *tw = calloc((size_t)repeat, sizeof *tw);
  size_t biggest = 0;
  for (int i = 0; i < ns; i++) biggest = strlen(texts[i]) > biggest ? strlen(texts[i]) : biggest;
  bad = !th || !tw;
  const char *host = p->ranks[p->nranks / 2].host;
  for (int k = 0; k < repeat && !bad; k++) {
    newt_plan q;
    plan_rank *v = NULL;
    int nv = 0;
    uint64_t t0 = newt_now_ns();
    bad = plan_head_from_json(head, strlen(head), &q) != NEWT_OK;
    int i = bad ? -1 : plan_shard_of_host(&q, host);
    bad = bad || i < 0 || plan_shard_read(&q, i, texts[i], strlen(texts[i]), &v, &nv) != NEWT_OK || nv < 1;
    th[k] = ms_since(t0);
    free(v);
    for (int j = 0; j < ns && !bad; j++) bad = plan_shard_add(&q, j, texts[j], strlen(texts[j])) != NEWT_OK;
    bad = bad || plan_shards_done(&q) != NEWT_OK || q.nranks != p->nranks;
    tw[k] = ms_since(t0);
    plan_free(&q);
  }
  if (bad) fprintf(stderr, "newt bench parse: plan of %d ranks in shards: %s\n", p->nranks, newt_errmsg());
  else {
    qsort(th, (size_t)repeat, sizeof *th, cmp_double);
    qsort(tw, (size_t)repeat, sizeof *tw, cmp_double);
    printf("{\"bench\":\"parse\",\"what\":\"plan_shards\",\"ranks\":%d,\"shards\":%d,\"head_bytes\":%zu,"
           "\"shard_bytes_max\":%zu,\"repeat\":%d,\"host_ms\":%.3f,\"whole_ms\":%.3f}\n",
           p->nranks, ns, strlen(head), biggest, repeat, th[repeat / 2], tw[repeat / 2]);
    fflush(stdout);
  }
  free(th);
  free(tw);
  free(head);
  plan_shard_texts_free(texts, ns);
  return bad;
}

static int bench_plan(int n, int repeat) {
  newt_plan p;
  memset(&p, 0, sizeof p);
  p.generation = 1;
  p.created_ms = 1;
  snprintf(p.cause, sizeof p.cause, "initial");
  snprintf(p.switch_mode, sizeof p.switch_mode, "abort");
  snprintf(p.restore, sizeof p.restore, "init");
  p.dp = n, p.tp = 1, p.pp = 1;
  p.global_batch = n, p.micro_batch = 1, p.accum = plan_accum(n, 1, n);
  p.nranks = n;
  p.ranks = calloc((size_t)n, sizeof *p.ranks);
  p.spares = calloc(1, sizeof *p.spares);
  if (!p.ranks || !p.spares) return 1;
  const int64_t step = n % 7919 ? 7919 : 1; /* a permutation of the workers: not in rank order */
  for (int i = 0; i < n; i++) {
    plan_rank *r = &p.ranks[i];
    r->rank = i, r->dp = i, r->tp = 0, r->pp = 0;
    snprintf(r->worker, sizeof r->worker, "worker-%07d", (int)(i * step % n));
    snprintf(r->host, sizeof r->host, "host-%05d", i / 8);
    snprintf(r->addr, sizeof r->addr, "10.%d.%d.%d:29500", (i >> 16) & 255, (i >> 8) & 255, i & 255);
  }
  char *text = plan_to_json(&p), last[PLAN_ID_MAX];
  snprintf(last, sizeof last, "%s", p.ranks[n - 1].worker);
  int bad_shards = bench_plan_shards(&p, repeat);
  plan_free(&p);
  if (!text) return 1;
  size_t len = strlen(text);
  double *t = calloc((size_t)repeat, sizeof *t);
  int bad = !t;
  for (int k = 0; k < repeat && !bad; k++) {
    newt_plan q;
    uint64_t t0 = newt_now_ns();
    newt_result_t r = plan_from_json(text, len, &q);
    t[k] = ms_since(t0);
    if (r != NEWT_OK || q.nranks != n || strcmp(q.ranks[n - 1].worker, last) != 0) {
      fprintf(stderr, "newt bench parse: plan of %d ranks: %s\n", n, r != NEWT_OK ? newt_errmsg() : "ranks differ");
      bad = 1;
    }
    if (r == NEWT_OK) plan_free(&q);
  }
  if (!bad) {
    qsort(t, (size_t)repeat, sizeof *t, cmp_double);
    printf("{\"bench\":\"parse\",\"what\":\"plan\",\"ranks\":%d,\"bytes\":%zu,\"repeat\":%d,\"parse_ms\":%.3f}\n", n,
           len, repeat, t[repeat / 2]);
    fflush(stdout);
  }
  free(t);
  free(text);
  return bad || bad_shards;
}

/* --- n events into a view --------------------------------------------------------------------- */

static int bench_events(int n, int reverse) {
  char prefix[256];
  if (job_prefix(prefix, sizeof prefix, "bench", JOB_REC_OTHER, -1) != NEWT_OK) return 1;
  rdzv_etcd_kv *kvs = calloc((size_t)n, sizeof *kvs);
  if (!kvs) return 1;
  int bad = 0;
  for (int i = 0; i < n && !bad; i++) {
    job_event e;
    memset(&e, 0, sizeof e);
    e.type = JOB_EV_WAITING;
    e.t_ms = 1700000000000ull + (uint64_t)i;
    snprintf(e.why, sizeof e.why, "waiting for 2 workers (event %d)", i);
    char *v = job_event_to_json(&e);
    char *k = newt_asprintf("%sevents/%016llu-%08x-%08x", prefix, (unsigned long long)e.t_ms, (unsigned)i,
                            (unsigned)(i * 2654435761u));
    if (!v || !k) bad = 1;
    kvs[i] = (rdzv_etcd_kv){.key = k, .key_len = k ? strlen(k) : 0, .value = v, .value_len = v ? strlen(v) : 0,
                            .mod_revision = i + 1, .create_revision = i + 1, .version = 1};
  }
  job_view v;
  memset(&v, 0, sizeof v);
  uint64_t t0 = newt_now_ns();
  for (int j = 0; j < n && !bad; j++) {
    const rdzv_etcd_kv *kv = &kvs[reverse ? n - 1 - j : j];
    job_change ch;
    job_change_decode(prefix, kv, 0, &ch);
    if (ch.rec != JOB_REC_EVENT) bad = 1;
    job_view_apply(&v, &ch);
    job_change_free(&ch);
  }
  double ms = ms_since(t0);
  if (!bad && v.nevents != n) {
    fprintf(stderr, "newt bench parse: %d events in the view, %d put\n", v.nevents, n);
    bad = 1;
  }
  if (!bad)
    printf("{\"bench\":\"parse\",\"what\":\"events\",\"events\":%d,\"order\":\"%s\",\"view_ms\":%.3f}\n", n,
           reverse ? "reverse" : "key", ms);
  fflush(stdout);
  job_view_free(&v);
  for (int i = 0; i < n; i++) {
    free((char *)kvs[i].key);
    free((char *)kvs[i].value);
  }
  free(kvs);
  return bad;
}

/* --- a large manifest ------------------------------------------------------------------------- */

enum { SHAPE_TENSORS, SHAPE_CHUNKS, SHAPE_BOXES8, SHAPE_N };
static const char *const shape_names[SHAPE_N] = {"tensors", "chunks", "boxes8"};

/* Chunk k of 16 raw bytes (4 f32 elements) at its place in the one shard file. */
static void put_chunk(newt_buf *b, long k, const char *box_offset, const char *box_shape, long begin, long end) {
  newt_buf_printf(b,
                  "%s{\"file\":0,\"offset\":%ld,\"stored\":16,\"raw\":16,\"codec\":\"raw\",\"filter\":\"none\","
                  "\"xxh_raw\":\"0000000000000000\",\"xxh_stored\":\"0000000000000000\",\"box_offset\":%s,"
                  "\"box_shape\":%s,\"begin\":%ld,\"end\":%ld}",
                  k ? "," : "", 4096 + k * 64, box_offset, box_shape, begin, end);
}

/* The manifest's JSON of about `bytes`: *tensors and *chunks say what it holds. */
static char *manifest_json(int shape, size_t bytes, long *tensors, long *chunks) {
  newt_buf b;
  newt_buf_init(&b);
  const long per = shape == SHAPE_TENSORS ? 260 : shape == SHAPE_CHUNKS ? 201 : 221; /* bytes of JSON per chunk */
  long n = (long)(bytes / (size_t)per) - 8;
  newt_buf_printf(&b, "{\"format\":\"newt-ckpt\",\"version\":1,\"kind\":\"manifest\",\"step\":1,\"nranks\":1,"
                      "\"attempt\":\"0000000000000001\",\"created_ms\":1,\"files\":[{\"name\":\"rank-00000-"
                      "0000000000000001.shard\",\"rank\":0,\"bytes\":%ld,\"raw_bytes\":%ld,\"layout\":{}}],\"tensors\":[",
                  4096 + (n + 1) * 64, n * 16);
  char off[64], shp[64];
  if (shape == SHAPE_TENSORS) {
    for (long k = 0; k < n; k++) {
      newt_buf_printf(&b, "%s{\"name\":\"layers.%08ld.weight\",\"dtype\":\"f32\",\"shape\":[4],\"chunks\":[", k ? "," : "",
                      k);
      put_chunk(&b, 0, "[0]", "[4]", 0, 4);
      newt_buf_printf(&b, "]}");
      /* each tensor's one chunk is at offset 4096: the file holds it (the reader does not open it) */
    }
    *tensors = n, *chunks = n;
  } else if (shape == SHAPE_CHUNKS) {
    snprintf(shp, sizeof shp, "[%ld]", n * 4);
    newt_buf_printf(&b, "{\"name\":\"flat\",\"dtype\":\"f32\",\"shape\":%s,\"chunks\":[", shp);
    for (long k = 0; k < n; k++) put_chunk(&b, k, "[0]", shp, 4 * k, 4 * k + 4);
    newt_buf_printf(&b, "]}");
    *tensors = 1, *chunks = n;
  } else {
    newt_buf_printf(&b, "{\"name\":\"boxes\",\"dtype\":\"f32\",\"shape\":[%ld,1,1,1,1,1,1,4],\"chunks\":[", n);
    snprintf(shp, sizeof shp, "[1,1,1,1,1,1,1,4]");
    for (long k = 0; k < n; k++) {
      snprintf(off, sizeof off, "[%ld,0,0,0,0,0,0,0]", k);
      put_chunk(&b, k, off, shp, 0, 4);
    }
    newt_buf_printf(&b, "]}");
    *tensors = 1, *chunks = n;
  }
  newt_buf_printf(&b, "],\"state\":{\"step\":1}}");
  return b.data;
}

/* Writes DIR/step-0000000001/MANIFEST (framed: the header line, then the JSON). */
static int write_manifest(const char *stepdir, const char *json) {
  size_t len = strlen(json);
  char head[128];
  snprintf(head, sizeof head, "newt-ckpt manifest 1 %zu %016llx\n", len, (unsigned long long)XXH3_64bits(json, len));
  char *path = newt_asprintf("%s/MANIFEST", stepdir);
  FILE *f = path ? fopen(path, "w") : NULL;
  int ok = f && fputs(head, f) >= 0 && fwrite(json, 1, len, f) == len;
  if (f && fclose(f) != 0) ok = 0;
  free(path);
  return ok ? 0 : 1;
}

/* In a child: ckpt_inspect of stepdir, its time and its peak memory above the start. */
static int inspect_in_child(const char *stepdir, int shape, size_t bytes, long tensors, long chunks) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    ckpt_info info;
    uint64_t t0 = newt_now_ns();
    newt_result_t r = ckpt_inspect(stepdir, &info);
    double ms = ms_since(t0);
    getrusage(RUSAGE_SELF, &b);
    if (r != NEWT_OK) {
      fprintf(stderr, "newt bench parse: manifest %s: %s\n", shape_names[shape], newt_errmsg());
      _exit(1);
    }
    size_t nch = 0;
    for (size_t i = 0; i < info.ntensors; i++) nch += info.tensors[i].chunks;
    if ((long)info.ntensors != tensors || (long)nch != chunks) {
      fprintf(stderr, "newt bench parse: manifest %s: %zu tensors, %zu chunks read, %ld and %ld written\n",
              shape_names[shape], info.ntensors, nch, tensors, chunks);
      _exit(1);
    }
    printf("{\"bench\":\"parse\",\"what\":\"manifest\",\"shape\":\"%s\",\"bytes\":%zu,\"tensors\":%ld,\"chunks\":%ld,"
           "\"inspect_ms\":%.3f,\"peak_rss_mb\":%.1f}\n",
           shape_names[shape], bytes, tensors, chunks, ms, (double)(b.ru_maxrss - a.ru_maxrss) / 1024.0);
    fflush(stdout);
    _exit(0);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return 1;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

static int bench_manifest(const char *tmp, double mb) {
  size_t bytes = (size_t)(mb * (1 << 20));
  if (bytes > ((size_t)8 << 20) - 4096) bytes = ((size_t)8 << 20) - 4096; /* the bound: refused unread above it */
  int bad = 0;
  for (int shape = 0; shape < SHAPE_N && !bad; shape++) {
    long tensors = 0, chunks = 0;
    char *json = NULL;
    for (size_t want = bytes; want > 4096;) { /* numbers grow with the count: aimed again when over */
      json = manifest_json(shape, want, &tensors, &chunks);
      if (!json || strlen(json) <= bytes) break;
      want = (size_t)((double)want * (double)bytes / (double)strlen(json) * 0.995);
      free(json);
      json = NULL;
    }
    char *stepdir = newt_asprintf("%s/step-%010d", tmp, shape + 1);
    bad = !json || !stepdir || newt_fs_mkdirs(stepdir, 0755) != NEWT_OK || write_manifest(stepdir, json) != 0;
    if (!bad) bad = inspect_in_child(stepdir, shape, strlen(json), tensors, chunks);
    free(json);
    free(stepdir);
  }
  return bad;
}

int newt_bench_parse(int argc, char **argv) {
  const char *ranks = "17500,100000";
  int64_t events = 40000, repeat = 3;
  double manifest_mb = 8;
  newt_opt opts[] = {
      {"ranks", NEWT_OPT_STR, &ranks, "plan sizes (ranks), comma-separated"},
      {"events", NEWT_OPT_INT, &events, "event records taken into a view (0: none)"},
      {"manifest-mb", NEWT_OPT_DOUBLE, &manifest_mb, "size of the manifests inspected, MiB (0: none; at most 8)"},
      {"repeat", NEWT_OPT_INT, &repeat, "reads of each plan (the median is printed)"},
      NEWT_OPT_END,
  };
  int ex = newt_opts_exit(newt_opts_parse("bench parse", "[flags]", opts, argc, argv, NULL, 0, NULL));
  if (ex >= 0) return ex;
  if (repeat < 1 || repeat > 1000 || events < 0 || events > 10000000 || manifest_mb < 0) {
    fprintf(stderr, "newt bench parse: --repeat 1..1000, --events 0..10000000, --manifest-mb 0 or more\n");
    return 2;
  }
  int bad = 0;
  if (manifest_mb > 0) { /* first: its children start small */
    char tmp[] = "/tmp/newt-bench-parse-XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    bad |= bench_manifest(tmp, manifest_mb);
    newt_fs_rm_rf(tmp);
  }
  char *list = newt_strdup(ranks), *save = NULL;
  for (char *t = list ? strtok_r(list, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save)) {
    int64_t n;
    if (newt_parse_int(t, &n) != 0 || n < 1 || n > (1 << 20)) {
      fprintf(stderr, "newt bench parse: --ranks: \"%s\" is not a count of 1 to %d\n", t, 1 << 20);
      free(list);
      return 2;
    }
    bad |= bench_plan((int)n, (int)repeat);
  }
  free(list);
  if (events > 0) {
    bad |= bench_events((int)events, 0);
    bad |= bench_events((int)events, 1);
  }
  return bad ? 1 : 0;
}
