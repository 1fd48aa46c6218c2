/* Parsing of chaos schedules (see chaos.h): an item is split at '@step=' (or '@ckpt=') and
 * then at ':'; the action picks the target's grammar. Errors name the item by its number (and, for the
 * etcd forms, its text). */
#include "launch/chaos.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strutil.h"
#include "rendezvous/etcd_server.h"

static const char *const action_names[] = {"kill", "stop", "term", "cont", "join", "restart", "wipe", "cut", "cut-etcd", "slow", "flip"};

#define BAD(...) NEWT_ERR(NEWT_ERR_INVALID, __VA_ARGS__)

/* A downtime in ms, min..600000, into *out; the error names the item. */
static newt_result_t etcd_ms(const char *v, int64_t min, int idx, const char *shown, int64_t *out) {
  if (newt_parse_int(v, out) != 0 || *out < min || *out > 600000)
    return BAD("--chaos: item %d \"%s\": etcd downtime \"%s\" is not %lld..600000 ms", idx + 1, shown, v,
               (long long)min);
  return NEWT_OK;
}

/* The member of an etcd item, 0..RDZV_ETCD_MAX_MEMBERS-1 (whether the private etcd has it
 * is the launcher's check). */
static newt_result_t etcd_member(const char *v, int idx, const char *shown, int *out) {
  int64_t i;
  if (newt_parse_int(v, &i) != 0 || i < 0 || i >= RDZV_ETCD_MAX_MEMBERS)
    return BAD("--chaos: item %d \"%s\": etcd member \"%s\" is not 0..%d", idx + 1, shown, v,
               RDZV_ETCD_MAX_MEMBERS - 1);
  *out = (int)i;
  return NEWT_OK;
}

/* ACTION ":etcd" ...: parts[1] is "etcd"; shown is the item as given. */
static newt_result_t parse_etcd(char **parts, int np, int idx, const char *shown, chaos_event *e) {
  e->target = CHAOS_ETCD;
  e->index = -1;
  e->arg = 2000;
  if ((e->action == CHAOS_RESTART || e->action == CHAOS_STOP) && np == 3 && strncmp(parts[2], "until=", 6) == 0) {
    /* away until the job completed a step (an event, not a time: a test of what training
       does without etcd cannot pass by luck) */
    if (newt_parse_int(parts[2] + 6, &e->until_step) != 0 || e->until_step <= e->step)
      return BAD("--chaos: item %d \"%s\": \"%s\": etcd comes back at a step after the item's own (%lld), as in "
                 "%s:etcd:until=%lld@step=%lld", idx + 1, shown, parts[2], (long long)e->step,
                 action_names[e->action], (long long)e->step + 10, (long long)e->step);
    e->arg = 0;
    return NEWT_OK;
  }
  switch (e->action) {
    case CHAOS_RESTART:
      if (np == 3 && (newt_parse_int(parts[2], &e->arg) != 0 || e->arg < 0 || e->arg > 600000))
        return BAD("--chaos: item %d: etcd downtime \"%s\" is not 0..600000 ms", idx + 1, parts[2]);
      if (np > 3) return BAD("--chaos: item %d: restart:etcd takes at most one value", idx + 1);
      return NEWT_OK;
    case CHAOS_WIPE:
      if (np > 3)
        return BAD("--chaos: item %d \"%s\": wipe:etcd takes at most one value (the downtime in ms)", idx + 1, shown);
      return np == 3 ? etcd_ms(parts[2], 0, idx, shown, &e->arg) : NEWT_OK;
    case CHAOS_KILL:
      if (np < 3)
        return BAD("--chaos: item %d \"%s\": kill:etcd needs a member, as in kill:etcd:0 or kill:etcd:0:3000 "
                   "(restart:etcd takes the whole etcd down)", idx + 1, shown);
      NEWT_CHECK(etcd_member(parts[2], idx, shown, &e->index));
      return np == 4 ? etcd_ms(parts[3], 0, idx, shown, &e->arg) : NEWT_OK;
    case CHAOS_STOP:
      /* one value is the whole etcd's downtime; a member takes two, stop:etcd:I:MS (a lone
         small number would read both ways, so a downtime is at least 100 ms) */
      if (np == 3 && (newt_parse_int(parts[2], &e->arg) != 0 || e->arg < 100 || e->arg > 600000))
        return BAD("--chaos: item %d \"%s\": etcd downtime \"%s\" is not 100..600000 ms (one member is "
                   "stop:etcd:I:MS, as in stop:etcd:1:2000)", idx + 1, shown, parts[2]);
      if (np == 3) return NEWT_OK;
      if (np == 4) {
        NEWT_CHECK(etcd_member(parts[2], idx, shown, &e->index));
        return etcd_ms(parts[3], 0, idx, shown, &e->arg);
      }
      return NEWT_OK;
    default:
      return BAD("--chaos: item %d \"%s\": %s does not apply to etcd (restart:etcd, stop:etcd, wipe:etcd, "
                 "kill:etcd:I, stop:etcd:I:MS)", idx + 1, shown, action_names[e->action]);
  }
}

/* ("cut" | "cut-etcd") ":" ("worker" | "rank" | "host") ":" I [":" MS | ":until=" S], and
 * "slow" with ":" KBIT before the length */
static newt_result_t parse_cut(char **parts, int np, int idx, const char *shown, chaos_event *e) {
  const char *a = action_names[e->action], *what = e->action == CHAOS_SLOW ? "the slow link" : "the cut";
  if (e->action == CHAOS_SLOW) { /* its rate: then the rest reads as a cut's */
    if (np < 4 || newt_parse_int(parts[3], &e->kbit) != 0 || e->kbit < 8 || e->kbit > 100000000)
      return BAD("--chaos: item %d \"%s\": slow needs a rate of 8..100000000 kbit/s after the target, as in "
                 "slow:host:1:20000 (and :MS or :until=S)", idx + 1, shown);
    for (int k = 3; k + 1 < np; k++) parts[k] = parts[k + 1];
    np--;
  }
  if (np < 3)
    return BAD("--chaos: item %d \"%s\": %s needs a target, as in %s:worker:1, %s:rank:0 or %s:host:1 (and :MS or "
               ":until=S: how long; none: it lasts)", idx + 1, shown, a, a, a, a);
  int64_t v;
  if (strcmp(parts[1], "worker") == 0 || strcmp(parts[1], "rank") == 0) {
    e->target = CHAOS_WORKER;
    e->by_rank = parts[1][0] == 'r';
  } else if (strcmp(parts[1], "host") == 0) {
    e->target = CHAOS_HOST;
  } else {
    return BAD("--chaos: item %d \"%s\": %s applies to worker:I, rank:R or host:I", idx + 1, shown, a);
  }
  if (newt_parse_int(parts[2], &v) != 0 || v < 0 || v > 100000)
    return BAD("--chaos: item %d \"%s\": %s \"%s\" is not a number", idx + 1, shown, parts[1], parts[2]);
  e->index = (int)v;
  if (np == 4 && strncmp(parts[3], "until=", 6) == 0) {
    if (newt_parse_int(parts[3] + 6, &e->until_step) != 0 || e->until_step <= e->step)
      return BAD("--chaos: item %d \"%s\": \"%s\": %s is mended at a step after the item's own (%lld)", idx + 1,
                 shown, parts[3], what, (long long)e->step);
  } else if (np == 4 && (newt_parse_int(parts[3], &e->arg) != 0 || e->arg < 1 || e->arg > 3600000)) {
    return BAD("--chaos: item %d \"%s\": how long %s lasts, \"%s\", is not 1..3600000 ms", idx + 1, shown, what,
               parts[3]);
  }
  return NEWT_OK;
}

static newt_result_t parse_item(char *item, int idx, chaos_event *e) {
  memset(e, 0, sizeof *e);
  char *at = strstr(item, "@step="), *ck = strstr(item, "@ckpt=");
  if (!at && !ck) return BAD("--chaos: item %d \"%s\": missing \"@step=N\" (or \"@ckpt=N\")", idx + 1, item);
  if (!at) at = ck;
  *at = '\0';
  const char *steps = at + 6;
  int64_t *when = at == ck ? &e->ckpt_step : &e->step;
  if (newt_parse_int(steps, when) != 0 || *when < (at == ck ? 1 : 0))
    return BAD("--chaos: item %d: %s \"%s\" is not a %s integer", idx + 1, at == ck ? "checkpoint step" : "step",
               steps, at == ck ? "positive" : "non-negative");
  char shown[128]; /* the item as given, for messages: tokenizing cuts it up */
  snprintf(shown, sizeof shown, "%s", item);
  char *parts[5] = {0};
  int np = 0;
  for (char *save = NULL, *tok = strtok_r(item, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
    if (np == 5 || (np == 4 && strcmp(parts[0], "slow") != 0)) return BAD("--chaos: item %d \"%s\": too many ':' fields", idx + 1, item);
    parts[np++] = tok;
  }
  if (np == 0) return BAD("--chaos: item %d is empty", idx + 1);
  int a = -1;
  for (int i = 0; i < (int)(sizeof action_names / sizeof action_names[0]); i++)
    if (strcmp(parts[0], action_names[i]) == 0) a = i;
  if (a < 0)
    return BAD("--chaos: item %d: unknown action \"%s\" (kill, stop, term, cont, join, restart, wipe, cut, cut-etcd, slow, flip)",
               idx + 1, parts[0]);
  e->action = (chaos_action)a;
  int64_t v;
  switch (e->action) {
    case CHAOS_JOIN:
      if (np != 2 || newt_parse_int(parts[1], &v) != 0 || v < 1 || v > 1024)
        return BAD("--chaos: item %d: join needs a count of workers 1..1024, as in join:2", idx + 1);
      e->target = CHAOS_WORKER;
      e->arg = v;
      e->index = -1;
      return NEWT_OK;
    case CHAOS_CUT:
    case CHAOS_CUT_ETCD:
    case CHAOS_SLOW:
      return parse_cut(parts, np, idx, shown, e);
    case CHAOS_FLIP: /* flip:rank:R[:TENSOR]@step=N */
      if (np < 3 || np > 4 || strcmp(parts[1], "rank") != 0 || newt_parse_int(parts[2], &v) != 0 || v < 0 || v > 100000)
        return BAD("--chaos: item %d \"%s\": flip applies to a rank, as in flip:rank:1@step=20 or "
                   "flip:rank:1:wte@step=20 (a tensor of its state)", idx + 1, shown);
      if (e->ckpt_step || e->step < 1)
        return BAD("--chaos: item %d \"%s\": flip lands after a step (@step=N, N at least 1), armed in every worker "
                   "at its start", idx + 1, shown);
      if (np == 4 && (strlen(parts[3]) >= sizeof e->tensor || strpbrk(parts[3], ";\"' ")))
        return BAD("--chaos: item %d \"%s\": \"%s\" is no tensor name", idx + 1, shown, parts[3]);
      e->target = CHAOS_WORKER;
      e->by_rank = 1;
      e->index = (int)v;
      if (np == 4) snprintf(e->tensor, sizeof e->tensor, "%s", parts[3]);
      return NEWT_OK;
    case CHAOS_RESTART:
    case CHAOS_WIPE:
      if (np < 2 || strcmp(parts[1], "etcd") != 0)
        return BAD("--chaos: item %d: %s applies to etcd, as in %s:etcd or %s:etcd:3000", idx + 1, parts[0],
                   parts[0], parts[0]);
      return parse_etcd(parts, np, idx, shown, e);
    default:
      break;
  }
  if (np >= 2 && strcmp(parts[1], "etcd") == 0) return parse_etcd(parts, np, idx, shown, e);
  if (np < 2) return BAD("--chaos: item %d: %s needs a target: worker:I, host:I or coordinator", idx + 1, parts[0]);
  if (strcmp(parts[1], "rank") == 0) {
    if (e->action == CHAOS_CONT) return BAD("--chaos: item %d: cont applies to worker:I (a stopped rank is no rank)", idx + 1);
    e->target = CHAOS_WORKER;
    e->by_rank = 1;
    if (np != 3 || newt_parse_int(parts[2], &v) != 0 || v < 0 || v > 100000)
      return BAD("--chaos: item %d: rank \"%s\" is not a number", idx + 1, np > 2 ? parts[2] : "");
    e->index = (int)v;
    return NEWT_OK;
  }
  if (strcmp(parts[1], "worker") == 0) {
    e->target = CHAOS_WORKER;
    if (np != 3 || newt_parse_int(parts[2], &v) != 0 || v < 0 || v > 100000)
      return BAD("--chaos: item %d: worker index \"%s\" is not a number", idx + 1, np > 2 ? parts[2] : "");
    e->index = (int)v;
    return NEWT_OK;
  }
  if (strcmp(parts[1], "host") == 0) {
    if (e->action != CHAOS_KILL)
      return BAD("--chaos: item %d \"%s\": only kill applies to a host (kill:host:I: every worker of simulated host "
                 "I at once, newt run --hosts)", idx + 1, shown);
    e->target = CHAOS_HOST;
    if (np > 3) return BAD("--chaos: item %d \"%s\": kill:host takes one value, the host, as in kill:host:1", idx + 1, shown);
    if (np != 3 || newt_parse_int(parts[2], &v) != 0 || v < 0 || v > 1023)
      return BAD("--chaos: item %d \"%s\": host \"%s\" is not 0..1023 (a simulated host of newt run --hosts)", idx + 1,
                 shown, np > 2 ? parts[2] : "");
    e->index = (int)v;
    return NEWT_OK;
  }
  if (strcmp(parts[1], "coordinator") == 0) {
    if (e->action == CHAOS_CONT) return BAD("--chaos: item %d: cont applies to workers only", idx + 1);
    e->target = CHAOS_COORDINATOR;
    e->index = -1;
    if (np == 3 && (newt_parse_int(parts[2], &v) != 0 || v < 0 || v > 1000))
      return BAD("--chaos: item %d: coordinator index \"%s\" is not a number", idx + 1, parts[2]);
    if (np == 3) e->index = (int)v;
    if (np > 3) return BAD("--chaos: item %d: too many fields", idx + 1);
    return NEWT_OK;
  }
  return BAD("--chaos: item %d: unknown target \"%s\" (worker:I, rank:R, host:I or coordinator)", idx + 1, parts[1]);
}

newt_result_t chaos_parse(const char *spec, chaos_plan *out) {
  memset(out, 0, sizeof *out);
  if (!spec || !*spec) return NEWT_OK;
  char *copy = strdup(spec);
  NEWT_CHECK_ALLOC(copy);
  int cap = 1;
  for (const char *p = spec; *p; p++) cap += *p == ',';
  chaos_event *ev = calloc((size_t)cap, sizeof *ev);
  if (!ev) {
    free(copy);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory parsing --chaos");
  }
  newt_result_t r = NEWT_OK;
  int n = 0;
  char *start = copy;
  for (int i = 0; r == NEWT_OK; i++) {
    char *comma = strchr(start, ',');
    if (comma) *comma = '\0';
    r = parse_item(start, i, &ev[n]);
    if (r == NEWT_OK) n++;
    if (!comma) break;
    start = comma + 1;
  }
  free(copy);
  if (r != NEWT_OK) {
    free(ev);
    return r;
  }
  /* insertion sort keeps equal steps in the order given (qsort is not stable) */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && ev[j - 1].step > ev[j].step; j--) {
      chaos_event t = ev[j];
      ev[j] = ev[j - 1];
      ev[j - 1] = t;
    }
  out->n = n;
  out->events = ev;
  return NEWT_OK;
}

void chaos_free(chaos_plan *p) {
  free(p->events);
  memset(p, 0, sizeof *p);
}

/* The item without its trigger. */
static void action_str(const chaos_event *e, char *buf, size_t cap) {
  const char *a = action_names[e->action];
  if (e->action == CHAOS_CUT || e->action == CHAOS_CUT_ETCD || e->action == CHAOS_SLOW) {
    char len[64] = "";
    if (e->action == CHAOS_SLOW) snprintf(len, sizeof len, ":%lld", (long long)e->kbit);
    size_t at = strlen(len);
    if (e->until_step) snprintf(len + at, sizeof len - at, ":until=%lld", (long long)e->until_step);
    else if (e->arg) snprintf(len + at, sizeof len - at, ":%lld", (long long)e->arg);
    snprintf(buf, cap, "%s:%s:%d%s", a, e->target == CHAOS_HOST ? "host" : e->by_rank ? "rank" : "worker", e->index,
             len);
    return;
  }
  switch (e->target) {
    case CHAOS_ETCD:
      if (e->until_step) snprintf(buf, cap, "%s:etcd:until=%lld", a, (long long)e->until_step);
      else if (e->index < 0) snprintf(buf, cap, "%s:etcd:%lld", a, (long long)e->arg);
      else snprintf(buf, cap, "%s:etcd:%d:%lld", a, e->index, (long long)e->arg);
      break;
    case CHAOS_HOST: snprintf(buf, cap, "%s:host:%d", a, e->index); break;
    case CHAOS_COORDINATOR:
      if (e->index < 0) snprintf(buf, cap, "%s:coordinator", a);
      else snprintf(buf, cap, "%s:coordinator:%d", a, e->index);
      break;
    default:
      if (e->action == CHAOS_JOIN) snprintf(buf, cap, "join:%lld", (long long)e->arg);
      else if (e->action == CHAOS_FLIP) snprintf(buf, cap, "flip:rank:%d%s%s", e->index, e->tensor[0] ? ":" : "", e->tensor);
      else snprintf(buf, cap, "%s:%s:%d", a, e->by_rank ? "rank" : "worker", e->index);
  }
}

const char *chaos_event_str(const chaos_event *e, char *buf, size_t cap) {
  action_str(e, buf, cap);
  size_t at = strlen(buf);
  if (at < cap)
    snprintf(buf + at, cap - at, e->ckpt_step ? "@ckpt=%lld" : "@step=%lld",
             (long long)(e->ckpt_step ? e->ckpt_step : e->step));
  return buf;
}
