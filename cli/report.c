/* The report page of a run (see report.h): HTML with inline SVG, written into a buffer.
 *
 * Each chart is a `chart`: a picture of w x h px with a plot area inside its margins, a
 * data range mapped onto it (px, py), axes with "nice" ticks (1, 2 or 5 times a power of
 * ten), and series drawn as polylines. Times are seconds since the run started (the
 * summary's t_start_ms, else the first record), so the page reads the same wherever and
 * whenever it was made. */
#include "cli/report.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

#define PAGE_W 960.0
#define MAX_POINTS 2400 /* a longer series is drawn with every k-th point */

typedef struct page {
  newt_buf *b;
  newt_result_t err; /* the first failure; later writes are skipped */
} page;

static void put(page *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(page *p, const char *fmt, ...) {
  if (p->err != NEWT_OK) return;
  char small[512];
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    p->err = NEWT_ERR(NEWT_ERR_INTERNAL, "report: bad format \"%s\"", fmt);
  } else if ((size_t)n < sizeof small) {
    p->err = newt_buf_append(p->b, small, (size_t)n);
  } else {
    char *big = malloc((size_t)n + 1);
    if (!big) p->err = NEWT_ERR(NEWT_ERR_NOMEM, "report: out of memory");
    else {
      vsnprintf(big, (size_t)n + 1, fmt, again);
      p->err = newt_buf_append(p->b, big, (size_t)n);
      free(big);
    }
  }
  va_end(again);
}

/* Text from outside (job names, faults, paths), escaped for HTML and SVG. */
static void put_text(page *p, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
      case '<': put(p, "&lt;"); break;
      case '>': put(p, "&gt;"); break;
      case '&': put(p, "&amp;"); break;
      case '"': put(p, "&quot;"); break;
      case '\'': put(p, "&#39;"); break;
      default: put(p, "%c", *s);
    }
  }
}

static const char *cause_color(const char *cause) {
  static const struct {
    const char *cause, *color;
  } colors[] = {{"crash", "#d62728"}, {"hang", "#9467bd"},        {"leave", "#e6850e"},
                {"join", "#2ca02c"},  {"coordinator", "#8c564b"}, {"etcd", "#17becf"},
                {"rebalance", "#8f9a12"}};
  for (size_t i = 0; i < sizeof colors / sizeof colors[0]; i++)
    if (strcmp(cause, colors[i].cause) == 0) return colors[i].color;
  return "#555";
}

static char *fmt_ms(int64_t ms, char *out, size_t cap) { return newt_fmt_duration((double)ms / 1e3, out, cap); }

/* --- numbers on axes ----------------------------------------------------------------------- */

/* 1, 2 or 5 times a power of ten, about range / n. */
static double nice_step(double range, int n) {
  if (!(range > 0) || !isfinite(range)) return 1;
  double raw = range / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

/* Widens [lo, hi] to multiples of its nice step (a flat series gets a range around it). */
static void nice_range(double *lo, double *hi, int n) {
  if (!(*hi > *lo)) {
    double pad = fabs(*lo) > 0 ? fabs(*lo) * 0.1 : 1;
    *lo -= pad;
    *hi += pad;
  }
  double s = nice_step(*hi - *lo, n);
  *lo = floor(*lo / s) * s;
  *hi = ceil(*hi / s) * s;
}

static void fmt_tick(double v, double step, char *out, size_t cap) {
  if (fabs(v) < step * 1e-9) v = 0;
  if (fabs(v) >= 1e6 && step >= 1e5) snprintf(out, cap, "%gM", v / 1e6);
  else if (fabs(v) >= 1e4 && step >= 1e3) snprintf(out, cap, "%gk", v / 1e3);
  else snprintf(out, cap, "%.*f", step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9), v);
}

/* --- charts ------------------------------------------------------------------------------- */

typedef struct chart {
  page *p;
  double w, h;                     /* the picture, px */
  double left, right, top, bottom; /* the plot area, px */
  double x0, x1, y0, y1;           /* the data range shown */
} chart;

static double px(const chart *c, double x) { return c->left + (x - c->x0) / (c->x1 - c->x0) * (c->right - c->left); }
static double py(const chart *c, double y) { return c->bottom - (y - c->y0) / (c->y1 - c->y0) * (c->bottom - c->top); }

static void chart_open(page *p, chart *c, const char *id, double h, const char *label) {
  memset(c, 0, sizeof *c);
  c->p = p;
  c->w = PAGE_W;
  c->h = h;
  c->left = 72;
  c->right = PAGE_W - 28;
  c->top = 40;
  c->bottom = h - 50;
  put(p, "<svg id=\"%s\" class=\"chart\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" role=\"img\" "
         "aria-label=\"",
      id, c->w, c->h, c->w, c->h);
  put_text(p, label);
  put(p, "\" xmlns=\"http://www.w3.org/2000/svg\">\n<title>");
  put_text(p, label);
  put(p, "</title>\n");
}

static void chart_close(chart *c) { put(c->p, "</svg>\n"); }

/* Grid, ticks, tick labels and the two axis titles (with units). */
static void chart_axes(chart *c, const char *xlabel, const char *ylabel, int yticks) {
  page *p = c->p;
  char t[32];
  double ys = nice_step(c->y1 - c->y0, yticks);
  put(p, "<g class=\"axis y\">\n");
  for (long k = (long)ceil(c->y0 / ys - 1e-9); k * ys <= c->y1 + ys * 1e-9; k++) {
    double v = (double)k * ys, y = py(c, v);
    fmt_tick(v, ys, t, sizeof t);
    put(p, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", c->left, y, c->right, y);
    put(p, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", c->left - 8, y + 4, t);
  }
  put(p, "</g>\n<g class=\"axis x\">\n");
  double xs = nice_step(c->x1 - c->x0, 9);
  for (long k = (long)ceil(c->x0 / xs - 1e-9); k * xs <= c->x1 + xs * 1e-9; k++) {
    double v = (double)k * xs, x = px(c, v);
    fmt_tick(v, xs, t, sizeof t);
    put(p, "<line class=\"tick\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x, c->bottom, x, c->bottom + 5);
    put(p, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, c->bottom + 19, t);
  }
  put(p, "</g>\n<line class=\"frame\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", c->left, c->top, c->left,
      c->bottom);
  put(p, "<line class=\"frame\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", c->left, c->bottom, c->right,
      c->bottom);
  put(p, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (c->left + c->right) / 2, c->h - 10);
  put_text(p, xlabel);
  put(p, "</text>\n<text class=\"label\" transform=\"translate(18 %.1f) rotate(-90)\" text-anchor=\"middle\">",
      (c->top + c->bottom) / 2);
  put_text(p, ylabel);
  put(p, "</text>\n");
}

/* A series as one polyline; points whose y is not finite are left out. */
static void chart_line(chart *c, const double *x, const double *y, size_t n, const char *cls) {
  size_t stride = n > MAX_POINTS ? n / MAX_POINTS + 1 : 1;
  put(c->p, "<polyline class=\"%s\" points=\"", cls);
  for (size_t i = 0; i < n; i += stride) {
    size_t k = i + stride >= n ? n - 1 : i; /* always the last point */
    if (isfinite(y[k]) && isfinite(x[k])) put(c->p, "%.1f,%.1f ", px(c, x[k]), py(c, y[k]));
  }
  put(c->p, "\"/>\n");
}

/* A legend entry at (x, y): a swatch (line or block) and its text; returns the x after it. */
static double legend(chart *c, double x, double y, const char *cls, const char *text, int block) {
  if (block) put(c->p, "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"10\"/>", cls, x, y - 9);
  else put(c->p, "<line class=\"%s\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", cls, x, y - 4, x + 22, y - 4);
  put(c->p, "<text x=\"%.1f\" y=\"%.1f\">", x + (block ? 19 : 27), y);
  put_text(c->p, text);
  put(c->p, "</text>\n");
  return x + (block ? 19 : 27) + 7.0 * (double)strlen(text) + 18;
}

/* --- the run as series ---------------------------------------------------------------------- */

typedef struct run_view {
  const report_input *in;
  const launcher_recovery *rec;
  int nrec;
  launcher_recovery *own; /* rec made from the event log (no summary); freed with the view */
  uint64_t t0, t_end; /* wall ms: the run's start and end */
} run_view;

static double secs(const run_view *v, uint64_t t_ms) { return ((double)t_ms - (double)v->t0) / 1e3; }

/* A job's own logs without `newt run`'s summary (the chart's, on the checkpoint volume): its
 * recoveries from the recovered events of the event log, timed as every view times them
 * (job_recovery_time; no injected fault is known, so from the first detection). */
static void recoveries_of_events(run_view *v, const report_input *in) {
  int n = 0;
  for (size_t i = 0; i < in->nevents; i++) n += in->events[i].type == JOB_EV_RECOVERED;
  if (!n || !(v->own = calloc((size_t)n, sizeof *v->own))) return;
  for (size_t i = 0; i < in->nevents; i++) {
    const job_event *e = &in->events[i];
    if (e->type != JOB_EV_RECOVERED) continue;
    launcher_recovery_of(e, 0, &v->own[v->nrec++]);
  }
  v->rec = v->own;
}

static void view_init(run_view *v, const report_input *in) {
  memset(v, 0, sizeof *v);
  v->in = in;
  if (in->summary) {
    v->rec = in->summary->res.recoveries;
    v->nrec = in->summary->res.nrecoveries;
    v->t0 = in->summary->res.t_start_ms;
  } else if (in->nevents) {
    recoveries_of_events(v, in);
  }
  uint64_t first = UINT64_MAX, last = 0;
  for (size_t i = 0; i < in->nsteps; i++)
    if (in->steps[i].t_ms) {
      if (in->steps[i].t_ms < first) first = in->steps[i].t_ms;
      if (in->steps[i].t_ms > last) last = in->steps[i].t_ms;
    }
  for (size_t i = 0; i < in->nevents; i++) {
    if (in->events[i].t_ms < first) first = in->events[i].t_ms;
    if (in->events[i].t_ms > last) last = in->events[i].t_ms;
  }
  if (!v->t0 || (first != UINT64_MAX && first < v->t0)) v->t0 = first != UINT64_MAX ? first : 0;
  if (in->summary && in->summary->res.wall_s > 0) {
    uint64_t end = in->summary->res.t_start_ms + (uint64_t)(in->summary->res.wall_s * 1e3);
    if (in->summary->res.t_start_ms && end > last) last = end;
  }
  for (int i = 0; i < v->nrec; i++)
    if (v->rec[i].t_ms + (uint64_t)v->rec[i].total_ms > last) last = v->rec[i].t_ms + (uint64_t)v->rec[i].total_ms;
  v->t_end = last > v->t0 ? last : v->t0 + 1000;
}

/* The step a recovery went on from: as the summary says, else the last step done before it. */
static double recovery_step(const run_view *v, const launcher_recovery *r) {
  if (r->step > 0 || !r->t_ms) return (double)r->step;
  int64_t s = 0;
  for (size_t i = 0; i < v->in->nsteps; i++)
    if (v->in->steps[i].t_ms <= r->t_ms) s = v->in->steps[i].step;
  return (double)s;
}

/* The label rows of markers: a marker too close to the one before it takes the next row. */
static int marker_row(double x, double *last_x, int *row) {
  *row = x - *last_x < 110 ? (*row + 1) % 3 : 0;
  *last_x = x;
  return *row;
}

static void marker(chart *c, double x, int index, const char *cause, const char *cls, int row, const char *tip) {
  page *p = c->p;
  const char *color = cause_color(cause);
  double y = c->top + 12 + 17.0 * row;
  put(p, "<g class=\"%s\" data-recovery=\"%d\" data-cause=\"", cls, index);
  put_text(p, cause);
  put(p, "\"><title>");
  put_text(p, tip);
  put(p, "</title>");
  put(p, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" "
         "stroke-dasharray=\"4 3\"/>",
      x, c->top, x, c->bottom, color);
  put(p, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"8\" fill=\"%s\"/>", x, y - 4, color);
  put(p, "<text class=\"badge\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>", x, y, index + 1);
  put(p, "<text class=\"mlabel\" x=\"%.1f\" y=\"%.1f\" fill=\"%s\">", x + 12, y, color);
  put_text(p, cause);
  put(p, "</text></g>\n");
}

static void recovery_tip(const launcher_recovery *r, int i, char *out, size_t cap) {
  char total[32], started[80] = "";
  if (r->from_start_ms >= 0)
    snprintf(started, sizeof started, " (%lld ms from the joiner's process start)", (long long)r->from_start_ms);
  snprintf(out, cap, "recovery %d: %s%s%s, %s%s, generation %lld, %lld ranks after, state from %s; the fault hit at "
           "step %lld, training went on from step %lld, %lld redone", i + 1, r->cause, r->fault[0] ? " after " : "",
           r->fault, fmt_ms(r->total_ms, total, sizeof total), started, (long long)r->generation, (long long)r->world,
           r->restore[0] ? r->restore : "?", (long long)launcher_recovery_fault_step(r), (long long)r->step,
           (long long)r->steps_lost);
}

/* --- the charts ----------------------------------------------------------------------------- */

static void loss_chart(page *p, const run_view *v) {
  const report_input *in = v->in;
  size_t n = in->nsteps, nb = in->nbaseline;
  double *x = malloc((n + nb + 1) * sizeof *x), *y = malloc((n + nb + 1) * sizeof *y);
  if (!x || !y) {
    free(x);
    free(y);
    p->err = NEWT_ERR(NEWT_ERR_NOMEM, "report: out of memory");
    return;
  }
  chart c;
  chart_open(p, &c, "loss-chart", 400, "Loss against step, with each recovery marked where training went on");
  double lo = INFINITY, hi = -INFINITY, last = 1;
  for (size_t i = 0; i < n; i++) {
    if (isfinite(in->steps[i].loss)) lo = fmin(lo, in->steps[i].loss), hi = fmax(hi, in->steps[i].loss);
    last = fmax(last, (double)in->steps[i].step);
  }
  for (size_t i = 0; i < nb; i++) {
    if (isfinite(in->baseline[i].loss)) lo = fmin(lo, in->baseline[i].loss), hi = fmax(hi, in->baseline[i].loss);
    last = fmax(last, (double)in->baseline[i].step);
  }
  if (!isfinite(lo)) lo = 0, hi = 1;
  nice_range(&lo, &hi, 6);
  c.x0 = 0;
  c.x1 = last;
  c.y0 = lo;
  c.y1 = hi;
  chart_axes(&c, "step", "loss (nats per token)", 6);
  double lx = 0;
  int row = 0;
  for (int i = 0; i < v->nrec; i++) {
    char tip[256];
    recovery_tip(&v->rec[i], i, tip, sizeof tip);
    double mx = px(&c, recovery_step(v, &v->rec[i]));
    marker(&c, mx, i, v->rec[i].cause, "recovery-marker", marker_row(mx, &lx, &row), tip);
  }
  for (size_t i = 0; i < n; i++) x[i] = (double)in->steps[i].step, y[i] = in->steps[i].loss;
  chart_line(&c, x, y, n, "run");
  if (nb) { /* on top: where the curves agree, its dashes lie on the run's line */
    for (size_t i = 0; i < nb; i++) x[i] = (double)in->baseline[i].step, y[i] = in->baseline[i].loss;
    chart_line(&c, x, y, nb, "baseline");
  }
  double lgx = c.right - (nb ? 420 : 150);
  lgx = legend(&c, lgx, 22, "run", "this run", 0);
  if (nb) legend(&c, lgx, 22, "baseline", in->baseline_name ? in->baseline_name : "baseline", 0);
  chart_close(&c);
  free(x);
  free(y);
}

/* World size over time, as steps, each generation labelled where it began: from the plans
 * of the event log, else from the step log. With the event log, the registered workers too
 * (ranks and spares: a plan's spares, workers that joined and stayed spares), dashed, when
 * any was a spare. */
static void membership_chart(page *p, const run_view *v) {
  const report_input *in = v->in;
  size_t cap = in->nevents + in->nsteps + 1, n = 0;
  double *t = malloc(cap * sizeof *t), *world = malloc(cap * sizeof *world), *gen = malloc(cap * sizeof *gen);
  double *all = malloc(cap * sizeof *all), *st = malloc(2 * cap * sizeof *st), *sw = malloc(2 * cap * sizeof *sw);
  double *sa = malloc(2 * cap * sizeof *sa);
  const job_event **plan = calloc(cap, sizeof *plan);
  if (!t || !world || !gen || !all || !st || !sw || !sa || !plan) {
    free(t), free(world), free(gen), free(all), free(st), free(sw), free(sa), free(plan);
    p->err = NEWT_ERR(NEWT_ERR_NOMEM, "report: out of memory");
    return;
  }
  double end = secs(v, v->t_end), top = 1;
  int spares = 0;
  for (size_t i = 0; i < in->nevents; i++) { /* (time, world, workers, generation) at each plan and spare event */
    const job_event *e = &in->events[i];
    if (e->type == JOB_EV_PLAN) {
      plan[n] = e, t[n] = secs(v, e->t_ms), world[n] = (double)e->world, gen[n] = (double)e->generation;
      all[n] = (double)(e->world + e->spares);
    } else if (e->type == JOB_EV_SPARE && n > 0) {
      t[n] = secs(v, e->t_ms), world[n] = world[n - 1], gen[n] = gen[n - 1];
      all[n] = all[n - 1] + e->nspare_ids;
    } else {
      continue;
    }
    spares |= all[n] > world[n];
    n++;
  }
  if (n == 0)
    for (size_t i = 0; i < in->nsteps; i++) {
      const job_step *s = &in->steps[i];
      if (n && world[n - 1] == (double)s->world && gen[n - 1] == (double)s->generation) continue;
      t[n] = secs(v, s->t_ms), world[n] = all[n] = (double)s->world, gen[n] = (double)s->generation;
      n++;
    }
  size_t m = 0; /* as steps: each value holds until the next change, the last one until the end */
  for (size_t i = 0; i < n; i++) {
    st[m] = t[i], sw[m] = world[i], sa[m] = all[i], m++;
    st[m] = i + 1 < n ? t[i + 1] : end, sw[m] = world[i], sa[m] = all[i], m++;
    top = fmax(top, all[i]);
  }
  chart c;
  chart_open(p, &c, "membership-chart", 300, "World size and generation over wall time");
  c.x0 = 0;
  c.x1 = end > 0 ? end : 1;
  c.y0 = 0;
  c.y1 = top + 1;
  chart_axes(&c, "wall time since the start (s)", "workers", (int)fmin(top + 1, 6));
  for (int i = 0; i < v->nrec; i++) { /* each recovery shaded for as long as it took */
    double a = px(&c, secs(v, v->rec[i].t_ms)), b = px(&c, secs(v, v->rec[i].t_ms) + (double)v->rec[i].total_ms / 1e3);
    put(p, "<rect class=\"band\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", a, c.top,
        fmax(b - a, 2.0), c.bottom - c.top, cause_color(v->rec[i].cause));
  }
  double lx = -1e9;
  int row = 0;
  for (int i = 0; i < v->nrec; i++) {
    char tip[256];
    recovery_tip(&v->rec[i], i, tip, sizeof tip);
    double mx = px(&c, secs(v, v->rec[i].t_ms));
    marker(&c, mx, i, v->rec[i].cause, "timeline-marker", marker_row(mx, &lx, &row), tip);
  }
  if (spares) chart_line(&c, st, sa, m, "workers");
  chart_line(&c, st, sw, m, "world");
  double last_x = -1e9; /* a label too close to the one before it goes higher */
  int lift = 0;
  for (size_t i = 0; i < n; i++) {
    if (in->nevents && !plan[i]) continue; /* a spare event: no new generation */
    double x = px(&c, t[i]), y = py(&c, world[i]);
    lift = x - last_x < 64 ? lift + 1 : 0;
    last_x = x;
    put(p, "<g class=\"gen\"><circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\"/><text x=\"%.1f\" y=\"%.1f\">gen %.0f</text>",
        x, y, x + 5, y - 8 - 14.0 * lift, gen[i]);
    put(p, "<title>generation %.0f", gen[i]);
    if (plan[i]) {
      put(p, " (");
      put_text(p, plan[i]->cause);
      put(p, "): dp %lld, %lld spares", (long long)plan[i]->dp, (long long)plan[i]->spares);
    }
    put(p, ": %.0f ranks from %.2f s</title></g>\n", world[i], t[i]);
  }
  double lg = legend(&c, c.right - (spares ? 560 : 310), 22, "world", "ranks training; gen N: generation", 0);
  if (spares) legend(&c, lg, 22, "workers", "registered workers (ranks + spares)", 0);
  chart_close(&c);
  free(t), free(world), free(gen), free(all), free(st), free(sw), free(sa), free(plan);
}

/* The spares of the run and why, one line per plan that had any and per worker that joined
 * to stay a spare (class "spare-note"). */
static void spare_notes(page *p, const run_view *v) {
  const report_input *in = v->in;
  int any = 0;
  for (size_t i = 0; i < in->nevents; i++) {
    const job_event *e = &in->events[i];
    if (!((e->type == JOB_EV_PLAN && e->spares > 0) || e->type == JOB_EV_SPARE)) continue;
    if (!any++) put(p, "<ul class=\"spares\">\n");
    put(p, "<li class=\"spare-note\">at %.2f s, ", secs(v, e->t_ms));
    if (e->type == JOB_EV_PLAN) {
      put(p, "plan %lld (", (long long)e->generation);
      put_text(p, e->cause);
      put(p, "): %lld ranks, %lld spare%s", (long long)e->world, (long long)e->spares, e->spares == 1 ? "" : "s");
    } else {
      put(p, "joined and stayed spare%s", e->nspare_ids == 1 ? "" : "s");
    }
    for (int k = 0; k < e->nspare_ids; k++) {
      put(p, "%s", k ? ", " : " (");
      put_text(p, e->spare_ids[k]);
      if (k + 1 == e->nspare_ids) put(p, ")");
    }
    put(p, ": ");
    put_text(p, e->why[0] ? e->why : "the layout had no room for them");
    put(p, "</li>\n");
  }
  if (any) put(p, "</ul>\n");
}

static void recovery_bars(page *p, const run_view *v) {
  static const char *const parts[] = {"detect", "plan", "communicator", "restore", "first step"};
  static const char *const fills[] = {"#d62728", "#ff9f1c", "#1f77b4", "#2ca02c", "#b8b8b8"};
  chart c;
  chart_open(p, &c, "recovery-chart", 96 + 46.0 * v->nrec, "Where the time of each recovery went, in ms");
  c.left = 190;
  c.top = 44;
  c.bottom = c.h - 50;
  double most = 1;
  for (int i = 0; i < v->nrec; i++) {
    const launcher_recovery *r = &v->rec[i];
    double sum = (double)(r->detect_ms + r->plan_ms + r->comm_ms + r->restore_ms + r->step_ms);
    most = fmax(most, fmax(sum, (double)r->total_ms));
  }
  c.x0 = 0;
  c.x1 = most * 1.12; /* room for the total after the longest bar */
  c.y0 = 0;
  c.y1 = v->nrec;
  double lo = 0;
  nice_range(&lo, &c.x1, 8);
  /* x axis only: rows are recoveries */
  char t[32];
  double xs = nice_step(c.x1, 8);
  for (long k = 0; k * xs <= c.x1 + xs * 1e-9; k++) {
    double x = px(&c, (double)k * xs);
    fmt_tick((double)k * xs, xs, t, sizeof t);
    put(p, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x, c.top, x, c.bottom);
    put(p, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, c.bottom + 19, t);
  }
  put(p, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time from the fault (or its "
         "detection) to the next completed step (ms)</text>\n",
      (c.left + c.right) / 2, c.h - 10);
  double lgx = c.left;
  for (size_t k = 0; k < 5; k++) {
    put(p, "<rect x=\"%.1f\" y=\"14\" width=\"14\" height=\"10\" fill=\"%s\"/><text x=\"%.1f\" y=\"23\">%s</text>\n",
        lgx, fills[k], lgx + 19, parts[k]);
    lgx += 19 + 7.2 * (double)strlen(parts[k]) + 22;
  }
  for (int i = 0; i < v->nrec; i++) {
    const launcher_recovery *r = &v->rec[i];
    int64_t ms[5] = {r->detect_ms, r->plan_ms, r->comm_ms, r->restore_ms, r->step_ms}; /* they add up to the total */
    double y = c.top + 8 + 46.0 * i, at = 0;
    put(p, "<g class=\"recovery-bar\" data-recovery=\"%d\">", i);
    put(p, "<text class=\"rlabel\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"%s\">%d  ", c.left - 10, y + 13,
        cause_color(r->cause), i + 1);
    put_text(p, r->cause);
    put(p, "</text><text class=\"rsub\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", c.left - 10, y + 28);
    put_text(p, r->fault[0] ? r->fault : "not injected");
    put(p, "</text>\n");
    for (int k = 0; k < 5; k++) {
      if (ms[k] <= 0) continue;
      double a = px(&c, at), b = px(&c, at + (double)ms[k]);
      put(p, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"24\" fill=\"%s\"><title>%s: %lld ms</title></rect>", a,
          y, fmax(b - a, 1.0), fills[k], parts[k], (long long)ms[k]);
      if (b - a >= 46)
        put(p, "<text class=\"inbar%s\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%lld ms</text>", k == 4 ? " dark" : "",
            (a + b) / 2, y + 16, (long long)ms[k]);
      at += (double)ms[k];
    }
    put(p, "<text class=\"total\" x=\"%.1f\" y=\"%.1f\">%lld ms</text></g>\n", px(&c, at) + 6, y + 16,
        (long long)r->total_ms);
  }
  chart_close(&c);
}

static void throughput_chart(page *p, const run_view *v) {
  const report_input *in = v->in;
  size_t n = in->nsteps;
  double *t = malloc((n + 1) * sizeof *t), *raw = malloc((n + 1) * sizeof *raw), *avg = malloc((n + 1) * sizeof *avg);
  if (!t || !raw || !avg) {
    free(t), free(raw), free(avg);
    p->err = NEWT_ERR(NEWT_ERR_NOMEM, "report: out of memory");
    return;
  }
  double hi = 1;
  for (size_t i = 0; i < n; i++) {
    t[i] = secs(v, in->steps[i].t_ms);
    raw[i] = in->steps[i].tokens_per_s;
  }
  /* the mean of the 9 steps around each (the step's own rate is noisy) */
  for (size_t i = 0; i < n; i++) {
    double sum = 0;
    int k = 0;
    for (size_t j = i >= 4 ? i - 4 : 0; j < n && j <= i + 4; j++)
      if (isfinite(raw[j])) sum += raw[j], k++;
    avg[i] = k ? sum / k : NAN;
    if (isfinite(avg[i])) hi = fmax(hi, avg[i] * 1.6);
  }
  chart c;
  chart_open(p, &c, "throughput-chart", 300, "Throughput over wall time, checkpoint commits as ticks");
  c.x0 = 0;
  c.x1 = fmax(secs(v, v->t_end), 1);
  c.y0 = 0;
  c.y1 = hi;
  double lo = 0;
  nice_range(&lo, &c.y1, 5);
  chart_axes(&c, "wall time since the start (s)", "tokens per second", 5);
  for (int i = 0; i < v->nrec; i++) {
    double a = px(&c, secs(v, v->rec[i].t_ms)), b = px(&c, secs(v, v->rec[i].t_ms) + (double)v->rec[i].total_ms / 1e3);
    put(p, "<rect class=\"band\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>recovery %d (",
        a, c.top, fmax(b - a, 2.0), c.bottom - c.top, cause_color(v->rec[i].cause), i + 1);
    put_text(p, v->rec[i].cause);
    put(p, "): %lld ms</title></rect>\n", (long long)v->rec[i].total_ms);
  }
  /* raw points clipped to the chart: a first step's rate can be far off */
  for (size_t i = 0; i < n; i++) raw[i] = isfinite(raw[i]) ? fmin(raw[i], c.y1) : NAN;
  chart_line(&c, t, raw, n, "tps-raw");
  chart_line(&c, t, avg, n, "tps");
  int64_t committed = 0;
  for (size_t i = 0; i < n; i++) {
    if (in->steps[i].ckpt <= committed) continue;
    committed = in->steps[i].ckpt;
    double x = px(&c, t[i]);
    put(p, "<g class=\"ckpt-tick\"><title>checkpoint of step %lld committed by %.2f s</title>", (long long)committed,
        t[i]);
    put(p, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/><path d=\"M%.1f %.1f l-5 -8 h10 z\"/></g>\n", x,
        c.bottom, x, c.bottom - 14, x, c.bottom - 14);
  }
  double lgx = legend(&c, c.right - 430, 22, "tps", "tokens/s (mean of 9 steps)", 0);
  lgx = legend(&c, lgx, 22, "tps-raw", "per step", 0);
  put(p, "<path class=\"ckpt-key\" d=\"M%.1f 14 l-5 -8 h10 z\" transform=\"translate(0 8)\"/><text x=\"%.1f\" "
         "y=\"22\">checkpoint</text>\n",
      lgx + 5, lgx + 14);
  chart_close(&c);
  free(t), free(raw), free(avg);
}

/* --- rank speeds (issue 41) ------------------------------------------------------------------ */

#define SPEED_RANKS 8 /* the slow ranks drawn (a colour each); the rest are in the note */

static int has_speeds(const report_input *in) {
  for (size_t i = 0; i < in->nsteps; i++)
    if (in->steps[i].sample_us > 0) return 1;
  return 0;
}

static int is_rebalance(const launcher_recovery *r) { return strcmp(r->cause, "rebalance") == 0; }

/* The data-parallel ranks the step log ever lists as off the median, each once, in the order
 * first seen (at most cap, *more set when there were others); returns how many. */
static int slow_ranks(const report_input *in, int *dps, int cap, int *more) {
  int n = 0;
  *more = 0;
  for (size_t i = 0; i < in->nsteps; i++)
    for (int k = 0; k < in->steps[i].nslow && k < JOB_SLOW_MAX; k++) {
      int d = in->steps[i].slow[k].dp, seen = 0;
      for (int j = 0; j < n; j++) seen |= dps[j] == d;
      if (seen) continue;
      if (n < cap) dps[n++] = d;
      else *more = 1;
    }
  return n;
}

/* Rank d's compute per sample at step s: as listed, else the median's (a rank not listed is
 * within the margin of it); not known where the step has no speeds or no such rank. */
static double rank_us(const job_step *s, int d) {
  if (!(s->sample_us > 0) || d >= s->dp) return NAN;
  for (int k = 0; k < s->nslow && k < JOB_SLOW_MAX; k++)
    if (s->slow[k].dp == d) return s->slow[k].us;
  return s->sample_us;
}

/* A marker where each rebalance took effect: the step training went on from, as on the loss
 * chart, numbered as the recoveries' table numbers it. */
static void rebalance_markers(chart *c, const run_view *v) {
  double lx = -1e9;
  int row = 0;
  for (int i = 0; i < v->nrec; i++) {
    if (!is_rebalance(&v->rec[i])) continue;
    char tip[256];
    snprintf(tip, sizeof tip, "recovery %d: rebalance to generation %lld, the new shares from step %lld", i + 1,
             (long long)v->rec[i].generation, (long long)recovery_step(v, &v->rec[i]) + 1);
    double mx = px(c, recovery_step(v, &v->rec[i]));
    marker(c, mx, i, "rebalance", "rebalance-marker", marker_row(mx, &lx, &row), tip);
  }
}

/* The median rank's compute per sample against step, each rank the step log lists as off it
 * beside it, and a marker where each rebalance took effect. */
static void speed_chart(page *p, const run_view *v, const int *dps, int nd) {
  const report_input *in = v->in;
  size_t n = in->nsteps;
  double *x = malloc((n + 1) * sizeof *x), *y = malloc((n + 1) * sizeof *y);
  if (!x || !y) {
    free(x), free(y);
    p->err = NEWT_ERR(NEWT_ERR_NOMEM, "report: out of memory");
    return;
  }
  double hi = 0, last = 1;
  for (size_t i = 0; i < n; i++) {
    const job_step *s = &in->steps[i];
    hi = fmax(hi, s->sample_us);
    for (int k = 0; k < s->nslow && k < JOB_SLOW_MAX; k++) hi = fmax(hi, s->slow[k].us);
    last = fmax(last, (double)s->step);
    x[i] = (double)s->step;
  }
  chart c;
  chart_open(p, &c, "speed-chart", 340, "Compute per sample of the median rank and of each slow rank against step, "
                                        "with each rebalance marked");
  c.x0 = 0;
  c.x1 = last;
  c.y0 = 0;
  c.y1 = hi * 1.15;
  double lo = 0;
  nice_range(&lo, &c.y1, 5);
  chart_axes(&c, "step", "compute per sample (\xc2\xb5s)", 5);
  rebalance_markers(&c, v);
  char cls[32], name[32];
  double lgx = c.left + 10;
  for (int j = 0; j < nd; j++) { /* under the median's line: a rank's meets it where it is not listed */
    for (size_t i = 0; i < n; i++) y[i] = rank_us(&in->steps[i], dps[j]);
    snprintf(cls, sizeof cls, "speed-rank sr%d", j);
    put(p, "<g data-dp=\"%d\">", dps[j]);
    chart_line(&c, x, y, n, cls);
    put(p, "</g>\n");
    snprintf(name, sizeof name, "dp %d", dps[j]);
    lgx = legend(&c, lgx, 22, cls, name, 0);
  }
  for (size_t i = 0; i < n; i++) y[i] = in->steps[i].sample_us > 0 ? in->steps[i].sample_us : NAN;
  chart_line(&c, x, y, n, "speed-median");
  legend(&c, lgx, 22, "speed-median", "median rank", 0);
  chart_close(&c);
  free(x), free(y);
}

/* Under the chart: how many rebalances, and the shares of the newest plan the event log has
 * (its event's why: "samples per step by measured speed: w1 4, w0 10, w2 10"). */
static void speed_note(page *p, const run_view *v, int more) {
  static const char *const SHARES = "samples per step by measured speed:";
  int rebalances = 0;
  for (int i = 0; i < v->nrec; i++) rebalances += is_rebalance(&v->rec[i]);
  put(p, "<p class=\"note\" id=\"speed-note\">%d rebalance%s.", rebalances, rebalances == 1 ? "" : "s");
  const job_event *plan = NULL;
  for (size_t i = 0; i < v->in->nevents; i++)
    if (v->in->events[i].type == JOB_EV_PLAN) plan = &v->in->events[i];
  if (plan) {
    const char *shares = strstr(plan->why, SHARES);
    put(p, " The last plan (generation %lld, ", (long long)plan->generation);
    put_text(p, plan->cause);
    if (shares) {
      put(p, ") gives each data-parallel rank its samples per step by measured speed:");
      put_text(p, shares + strlen(SHARES));
      put(p, ".");
    } else {
      put(p, ") shares the global batch evenly.");
    }
  }
  if (more) put(p, " More than %d ranks were off the median: the first %d listed are drawn.", SPEED_RANKS, SPEED_RANKS);
  put(p, "</p>\n");
}

/* The section, only for a step log with the ranks' speeds (a run of the previous release, or
 * of `newt train`, has none: no empty chart). */
static void speed_section(page *p, const run_view *v) {
  if (!has_speeds(v->in)) return;
  int dps[SPEED_RANKS], more = 0;
  int nd = slow_ranks(v->in, dps, SPEED_RANKS, &more);
  put(p, "<h2>Rank speeds</h2>\n<p class=\"note\">Each data-parallel rank's compute per sample (its step's compute "
         "less its time in collectives, over its samples), as the step log has it: the median rank's over the last "
         "steps, and each rank ever found off it by more than the margin (a rank is drawn at the median where the "
         "step does not list it: it is within the margin). Dashed: a rebalance, from the step it took effect.</p>\n");
  speed_chart(p, v, dps, nd);
  speed_note(p, v, more);
}

/* --- the page ------------------------------------------------------------------------------- */

static const char *const STYLE =
    "body{font:14px/1.45 'DejaVu Sans',Helvetica,Arial,sans-serif;color:#1d2125;background:#fff;margin:0}"
    "main{max-width:1000px;margin:0 auto;padding:20px 20px 40px}"
    "h1{font-size:24px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 4px}"
    "p.lead{color:#555;margin:0 0 14px}p.note{color:#555;margin:2px 0 6px;font-size:13px}"
    ".cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}"
    ".card{border:1px solid #dde1e5;border-radius:6px;padding:8px 12px;min-width:110px}"
    ".card b{display:block;font-size:19px}.card span{color:#555;font-size:12px}"
    "svg.chart{display:block;max-width:100%;height:auto;font-size:12px;fill:#333}"
    "svg .grid{stroke:#e7e9ec}svg .tick,svg .frame{stroke:#888}svg .label{font-size:13px;fill:#222}"
    "svg polyline{fill:none;stroke-linejoin:round}"
    "svg .run{stroke:#1f77b4;stroke-width:2.2}svg .baseline{stroke:#111;stroke-width:1.2;stroke-dasharray:5 5;opacity:.75}"
    "svg line.run,svg line.baseline{stroke-width:2.5}"
    "svg .world{stroke:#1f77b4;stroke-width:2.4}svg .workers{stroke:#9467bd;stroke-width:2;stroke-dasharray:6 4}svg .gen circle{fill:#fff;stroke:#1f77b4;stroke-width:2}"
    "svg .gen text{font-weight:bold;fill:#1f4e79}svg circle.plan{fill:#1f77b4}"
    "svg .tps{stroke:#1f77b4;stroke-width:1.8}svg .tps-raw{stroke:#aac8e4;stroke-width:1}"
    "svg .speed-median{stroke:#1f77b4;stroke-width:2.4}svg .speed-rank{stroke-width:1.6}"
    "svg .sr0{stroke:#d62728}svg .sr1{stroke:#ff7f0e}svg .sr2{stroke:#9467bd}svg .sr3{stroke:#8c564b}"
    "svg .sr4{stroke:#e377c2}svg .sr5{stroke:#7f7f7f}svg .sr6{stroke:#17becf}svg .sr7{stroke:#2ca02c}"
    "svg .band{opacity:.16}svg .badge{fill:#fff;font-size:10px;font-weight:bold}svg .mlabel{font-weight:bold}"
    "svg .ckpt-tick line{stroke:#444;stroke-width:1.5}svg .ckpt-tick path,svg .ckpt-key{fill:#444}"
    "svg .rlabel{font-weight:bold;font-size:13px}svg .rsub{fill:#666;font-size:11px}"
    "svg .inbar{fill:#fff;font-size:11px}svg .inbar.dark{fill:#222}svg .total{font-weight:bold}"
    "table{border-collapse:collapse;margin-top:8px;font-size:13px;width:100%}"
    "th,td{border-bottom:1px solid #e3e6e9;padding:5px 7px;text-align:right;white-space:nowrap}th{white-space:normal}"
    "th{background:#f4f6f8}td.l,th.l{text-align:left}"
    "footer{color:#777;font-size:12px;margin-top:30px;word-break:break-all}";

static void card(page *p, const char *value, const char *what) {
  put(p, "<div class=\"card\"><b>");
  put_text(p, value);
  put(p, "</b><span>%s</span></div>\n", what);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static void cards(page *p, const run_view *v) {
  const report_input *in = v->in;
  const launcher_summary *s = in->summary;
  char a[64], b[64];
  int64_t last = in->nsteps ? in->steps[in->nsteps - 1].step : 0;
  put(p, "<div class=\"cards\">\n");
  if (s && s->steps_planned) snprintf(a, sizeof a, "%lld / %lld", (long long)(s->res.steps ? s->res.steps : last),
                                      (long long)s->steps_planned);
  else snprintf(a, sizeof a, "%lld", (long long)(s ? s->res.steps : last));
  card(p, a, "steps");
  double final = s ? s->res.final_loss : in->nsteps ? in->steps[in->nsteps - 1].loss : NAN;
  snprintf(a, sizeof a, "%.4f", final);
  card(p, a, "final loss");
  if (in->nbaseline) {
    snprintf(a, sizeof a, "%.4f", in->baseline[in->nbaseline - 1].loss);
    card(p, a, "final loss of the baseline");
  }
  if (s || in->nevents) {
    snprintf(a, sizeof a, "%d", v->nrec);
    card(p, a, "recoveries");
    if (v->nrec) {
      int64_t *tot = malloc((size_t)v->nrec * sizeof *tot), lost = 0;
      for (int i = 0; tot && i < v->nrec; i++) tot[i] = v->rec[i].total_ms, lost += v->rec[i].steps_lost;
      if (tot) { /* the middle one, or the mean of the two middle ones */
        qsort(tot, (size_t)v->nrec, sizeof *tot, cmp_i64);
        int64_t med = v->nrec % 2 ? tot[v->nrec / 2] : (tot[v->nrec / 2 - 1] + tot[v->nrec / 2]) / 2;
        card(p, fmt_ms(med, a, sizeof a), v->nrec == 1 ? "recovery" : "median recovery");
      }
      free(tot);
      snprintf(b, sizeof b, "%lld", (long long)lost);
      if (!s || !s->res.restart_mode) card(p, b, "steps redone"); /* else beats: the program's are below */
    }
  }
  if (s) {
    snprintf(a, sizeof a, "%lld", (long long)s->res.generations);
    card(p, a, "generations");
    if (s->res.restart_mode) { /* the program's own: newt counted none of its samples */
      snprintf(a, sizeof a, "%lld", (long long)s->res.restarts);
      card(p, a, "restarts of the program");
      snprintf(a, sizeof a, "%lld", (long long)s->res.steps_redone);
      card(p, a, "the program's steps redone");
    } else {
      snprintf(a, sizeof a, "%lld", (long long)s->res.samples_consumed);
      card(p, a, "samples consumed");
    }
    if (s->res.samples_repeated > 0) {
      snprintf(a, sizeof a, "%lld", (long long)s->res.samples_repeated);
      card(p, a, "samples trained twice");
    }
    if (s->res.ckpts_skipped > 0) {
      snprintf(a, sizeof a, "%lld", (long long)s->res.ckpts_skipped);
      card(p, a, "checkpoints skipped");
    }
    if (s->res.resumed_step > 0) {
      snprintf(a, sizeof a, "%lld", (long long)s->res.resumed_step);
      card(p, a, "resumed from the checkpoint of step");
    }
    card(p, newt_fmt_duration(s->res.wall_s, a, sizeof a), "wall time");
  }
  put(p, "</div>\n");
}

/* The largest |loss - baseline| over the steps both have. */
static void baseline_note(page *p, const report_input *in) {
  double worst = 0;
  int64_t at = 0;
  size_t common = 0;
  for (size_t i = 0, j = 0; i < in->nsteps && j < in->nbaseline;) {
    if (in->steps[i].step < in->baseline[j].step) i++;
    else if (in->steps[i].step > in->baseline[j].step) j++;
    else {
      double d = fabs(in->steps[i].loss - in->baseline[j].loss);
      if (d > worst || !isfinite(d)) worst = d, at = in->steps[i].step;
      common++, i++, j++;
    }
  }
  put(p, "<p class=\"note\">Dashed: ");
  put_text(p, in->baseline_name ? in->baseline_name : "the baseline");
  if (common) put(p, ". Over the %zu steps both have, the losses differ by at most %.3g (step %lld).</p>\n", common,
                  worst, (long long)at);
  else put(p, ". It has no step in common with this run.</p>\n");
}

static void recovery_table(page *p, const run_view *v) {
  put(p, "<table id=\"recoveries\"><thead><tr><th>#</th><th class=\"l\">cause</th><th class=\"l\">fault "
         "injected</th><th>fault at step</th><th>went on from step</th><th>at (s)</th><th>gen.</th><th>ranks "
         "after</th><th>detect</th><th>plan</th><th>comm.</th><th>restore</th><th>total</th><th class=\"l\">state "
         "from</th><th>steps redone</th></tr></thead>\n<tbody>\n");
  for (int i = 0; i < v->nrec; i++) {
    const launcher_recovery *r = &v->rec[i];
    put(p, "<tr><td>%d</td><td class=\"l\" style=\"color:%s;font-weight:bold\">", i + 1, cause_color(r->cause));
    put_text(p, r->cause);
    put(p, "</td><td class=\"l\">");
    put_text(p, r->fault[0] ? r->fault : r->t_fault ? "yes" : "no");
    double from = recovery_step(v, r);
    int64_t hit = r->fault_step > 0 ? r->fault_step : (int64_t)from + r->steps_lost; /* launcher_recovery_fault_step */
    put(p, "</td><td>%lld</td><td>%.0f</td><td>%.2f</td><td>%lld</td><td>%lld</td>", (long long)hit, from,
        r->t_ms ? secs(v, r->t_ms) : 0, (long long)r->generation, (long long)r->world);
    put(p, "<td>%lld ms</td><td>%lld ms</td><td>%lld ms</td><td>%lld ms</td><td><b>%lld ms</b>",
        (long long)r->detect_ms, (long long)r->plan_ms, (long long)r->comm_ms, (long long)r->restore_ms,
        (long long)r->total_ms);
    if (r->from_start_ms >= 0) /* a join: the joiner's start-up too */
      put(p, "<br><span class=\"from-start\">%lld ms from the joiner's process start</span>", (long long)r->from_start_ms);
    put(p, "</td><td class=\"l\">");
    put_text(p, r->restore[0] ? r->restore : "?");
    put(p, "</td><td>%lld</td></tr>\n", (long long)r->steps_lost);
  }
  put(p, "</tbody></table>\n");
}

newt_result_t report_html(const report_input *in, newt_buf *out) {
  page pg = {.b = out}, *p = &pg;
  run_view v;
  view_init(&v, in);
  const launcher_summary *s = in->summary;
  put(p, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>newt report: ");
  put_text(p, in->title);
  put(p, "</title>\n<style>%s</style>\n</head><body><main>\n<h1>newt report: ", STYLE);
  put_text(p, in->title);
  put(p, "</h1>\n<p class=\"lead\">");
  if (s) {
    put(p, "%s after %lld steps", s->res.done ? "Finished" : "Stopped", (long long)s->res.steps);
    if (!s->res.done && s->res.reason[0]) { /* interrupted by SIGINT at step 37, ... */
      put(p, " (");
      put_text(p, s->res.reason);
      put(p, ")");
    }
    if (s->workers) put(p, ", %lld workers at the start", (long long)s->workers);
    if (s->global_batch) put(p, ", global batch %lld (kept across every resize)", (long long)s->global_batch);
    put(p, ".");
    if (s->res.resumed_step > 0) { /* the first generation's state came from an earlier run's checkpoint */
      put(p, " Resumed from the checkpoint of step %lld in ", (long long)s->res.resumed_step);
      put_text(p, s->res.resumed_dir[0] ? s->res.resumed_dir : "?");
      put(p, ".");
    }
  } else if (in->nevents) {
    put(p, "A job's step and event logs, without newt run's summary: %zu steps, %d recoveries.", in->nsteps, v.nrec);
  } else {
    put(p, "A step log without a summary: %zu steps.", in->nsteps);
  }
  put(p, "</p>\n");
  cards(p, &v);

  put(p, "<h2>Loss</h2>\n");
  if (v.nrec)
    put(p, "<p class=\"note\">Each recovery is marked at the step training went on from; the numbers match the "
           "table below.</p>\n");
  loss_chart(p, &v);
  if (in->nbaseline) baseline_note(p, in);
  if (in->redone)
    put(p, "<p class=\"note\">%zu steps were done again after a rollback; each is drawn as its newest "
           "generation did it.</p>\n", in->redone);

  put(p, "<h2>Membership</h2>\n<p class=\"note\">World size over wall time, each generation labelled where it "
         "began; each recovery is shaded for as long as it took, from the fault to the next completed step. Spares "
         "(registered workers the layout leaves out) are listed below the chart with the reason.</p>\n");
  membership_chart(p, &v);
  spare_notes(p, &v);

  put(p, "<h2>Recoveries</h2>\n");
  if (v.nrec) recovery_bars(p, &v);
  else put(p, "<p class=\"note\">%s</p>\n", s || in->nevents ? "No recoveries: nothing failed, and nobody joined or left."
                                                            : "A step log alone holds no recoveries (give the run's "
                                                              "summary or the job's event log).");

  put(p, "<h2>Throughput</h2>\n");
  throughput_chart(p, &v);
  speed_section(p, &v);

  if (v.nrec) {
    put(p, "<h2>The recoveries</h2>\n<p class=\"note\">A recovery's time runs from the fault to the next completed "
           "step, as in <code>newt run</code> and <code>newt status</code>: the fault's moment where newt run injected "
           "it, otherwise its first detection (a survivor's report, a lapsed lease, a stall; for a join, the joiner's "
           "registration as the leader saw it). Detect: from the fault to its first detection; plan: to the plan; "
           "comm.: to the communicator; restore: to the state restored; total: to the next completed step. The median "
           "of the cards is the middle recovery's total, or the mean of the two middle ones. The steps are one "
           "account: the fault hit when the job had completed its <i>fault at step</i>, training went on from the "
           "step its state was restored at, and the steps between were done again (<i>steps redone</i>, each one "
           "global batch of samples trained twice).</p>\n");
    recovery_table(p, &v);
  }
  put(p, "<footer>Made by newt %s (newt report) from ", NEWT_VERSION);
  put_text(p, in->sources);
  if (in->torn) put(p, "; %zu torn last line(s) of the step log were skipped", in->torn);
  put(p, ".</footer>\n</main></body></html>\n");
  free(v.own);
  return pg.err;
}
