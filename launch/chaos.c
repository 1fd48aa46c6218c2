/* The chaos actions (see chaos.h): one table, chaos_kinds[], with a row per action and target.
 * A row owns its name, the grammar of what follows it, how it is printed, what the run must
 * offer it (the private etcd, --netns, --hosts), how it is fired and mended (inject.c) and
 * what recovery answers it (recoveries.c pairs them). Parsing, printing, the needs check,
 * firing and mending loop over the table; a new action is one row and its functions.
 *
 * An item is split at '@step=' (or '@ckpt=') and then at ':'; the first row of its action
 * reads the rest and picks the target. Errors name the item by its number (and, for most
 * forms, its text). */
#include "launch/chaos.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strutil.h"
#include "launch/run.h"
#include "rendezvous/etcd_server.h"

#define BAD(...) NEWT_ERR(NEWT_ERR_INVALID, __VA_ARGS__)

/* An item being parsed: its ':' fields (parts[0] the action), its number, its text. */
typedef struct chaos_item {
  char *parts[5];
  int np;
  int idx;         /* from 0 */
  char shown[128]; /* the item as given, for messages: tokenizing cuts it up */
} chaos_item;

typedef struct chaos_kind chaos_kind;
struct chaos_kind {
  const char *name;     /* the item's ACTION */
  chaos_action action;
  chaos_target target;  /* a rank is a worker target (by_rank) */
  const char *grammar;  /* what follows the action (chaos.h has the whole grammar) */
  int fields;           /* the most ':' fields of an item (the action's first row says) */
  const char *want;     /* a host target: said where --hosts is missing (NULL: none) */
  /* the fields into e (its action set): the target and the values (the action's first row
     reads every target of it) */
  newt_result_t (*parse)(chaos_item *it, chaos_event *e);
  void (*print)(const chaos_kind *k, const chaos_event *e, char *buf, size_t cap); /* without the trigger */
  unsigned needs;       /* CHAOS_NEEDS_*: what the run must offer it */
  int (*fire)(run *r, const chaos_event *e, const newt_plan *plan, const char *what); /* inject.c */
  void (*mend)(run *r, int64_t step); /* undoes what is due of its faults in force (NULL: none) */
  chaos_answer answer;  /* the recovery that answers its fault */
};

static const chaos_kind *kind_of(chaos_action action, chaos_target target);
static const char *action_name(chaos_action action);

/* A downtime in ms, min..600000, into *out; the error names the item. */
static newt_result_t etcd_ms(const char *v, int64_t min, const chaos_item *it, int64_t *out) {
  if (newt_parse_int(v, out) != 0 || *out < min || *out > 600000)
    return BAD("--chaos: item %d \"%s\": etcd downtime \"%s\" is not %lld..600000 ms", it->idx + 1, it->shown, v,
               (long long)min);
  return NEWT_OK;
}

/* The member of an etcd item, 0..RDZV_ETCD_MAX_MEMBERS-1 (whether the private etcd has it
 * is the launcher's check). */
static newt_result_t etcd_member(const char *v, const chaos_item *it, int *out) {
  int64_t i;
  if (newt_parse_int(v, &i) != 0 || i < 0 || i >= RDZV_ETCD_MAX_MEMBERS)
    return BAD("--chaos: item %d \"%s\": etcd member \"%s\" is not 0..%d", it->idx + 1, it->shown, v,
               RDZV_ETCD_MAX_MEMBERS - 1);
  *out = (int)i;
  return NEWT_OK;
}

/* ACTION ":etcd" ...: parts[1] is "etcd". */
static newt_result_t parse_etcd(chaos_item *it, chaos_event *e) {
  char **parts = it->parts;
  int np = it->np, n = it->idx + 1;
  const char *shown = it->shown;
  e->target = CHAOS_ETCD;
  e->index = -1;
  e->arg = 2000;
  if ((e->action == CHAOS_RESTART || e->action == CHAOS_STOP) && np == 3 && strncmp(parts[2], "until=", 6) == 0) {
    /* away until the job completed a step (an event, not a time: a test of what training
       does without etcd cannot pass by luck) */
    if (newt_parse_int(parts[2] + 6, &e->until_step) != 0 || e->until_step <= e->step)
      return BAD("--chaos: item %d \"%s\": \"%s\": etcd comes back at a step after the item's own (%lld), as in "
                 "%s:etcd:until=%lld@step=%lld", n, shown, parts[2], (long long)e->step, parts[0],
                 (long long)e->step + 10, (long long)e->step);
    e->arg = 0;
    return NEWT_OK;
  }
  switch (e->action) {
    case CHAOS_RESTART:
      if (np == 3 && (newt_parse_int(parts[2], &e->arg) != 0 || e->arg < 0 || e->arg > 600000))
        return BAD("--chaos: item %d: etcd downtime \"%s\" is not 0..600000 ms", n, parts[2]);
      if (np > 3) return BAD("--chaos: item %d: restart:etcd takes at most one value", n);
      return NEWT_OK;
    case CHAOS_WIPE:
      if (np > 3)
        return BAD("--chaos: item %d \"%s\": wipe:etcd takes at most one value (the downtime in ms)", n, shown);
      return np == 3 ? etcd_ms(parts[2], 0, it, &e->arg) : NEWT_OK;
    case CHAOS_KILL:
      if (np < 3)
        return BAD("--chaos: item %d \"%s\": kill:etcd needs a member, as in kill:etcd:0 or kill:etcd:0:3000 "
                   "(restart:etcd takes the whole etcd down)", n, shown);
      NEWT_CHECK(etcd_member(parts[2], it, &e->index));
      return np == 4 ? etcd_ms(parts[3], 0, it, &e->arg) : NEWT_OK;
    case CHAOS_STOP:
      /* one value is the whole etcd's downtime; a member takes two, stop:etcd:I:MS (a lone
         small number would read both ways, so a downtime is at least 100 ms) */
      if (np == 3 && (newt_parse_int(parts[2], &e->arg) != 0 || e->arg < 100 || e->arg > 600000))
        return BAD("--chaos: item %d \"%s\": etcd downtime \"%s\" is not 100..600000 ms (one member is "
                   "stop:etcd:I:MS, as in stop:etcd:1:2000)", n, shown, parts[2]);
      if (np == 4) {
        NEWT_CHECK(etcd_member(parts[2], it, &e->index));
        return etcd_ms(parts[3], 0, it, &e->arg);
      }
      return NEWT_OK;
    default:
      return BAD("--chaos: item %d \"%s\": %s does not apply to etcd (restart:etcd, stop:etcd, wipe:etcd, "
                 "kill:etcd:I, stop:etcd:I:MS)", n, shown, parts[0]);
  }
}

/* restart, wipe: only etcd. */
static newt_result_t parse_etcd_only(chaos_item *it, chaos_event *e) {
  const char *a = it->parts[0];
  if (it->np < 2 || strcmp(it->parts[1], "etcd") != 0)
    return BAD("--chaos: item %d: %s applies to etcd, as in %s:etcd or %s:etcd:3000", it->idx + 1, a, a, a);
  return parse_etcd(it, e);
}

/* ("cut" | "cut-etcd") ":" ("worker" | "rank" | "host") ":" I [":" MS | ":until=" S], and
 * "slow" with ":" KBIT before the length */
static newt_result_t parse_cut(chaos_item *it, chaos_event *e) {
  char **parts = it->parts;
  int n = it->idx + 1;
  const char *a = parts[0], *shown = it->shown, *what = e->action == CHAOS_SLOW ? "the slow link" : "the cut";
  if (e->action == CHAOS_SLOW) { /* its rate: then the rest reads as a cut's */
    if (it->np < 4 || newt_parse_int(parts[3], &e->kbit) != 0 || e->kbit < 8 || e->kbit > 100000000)
      return BAD("--chaos: item %d \"%s\": slow needs a rate of 8..100000000 kbit/s after the target, as in "
                 "slow:host:1:20000 (and :MS or :until=S)", n, shown);
    for (int k = 3; k + 1 < it->np; k++) parts[k] = parts[k + 1];
    it->np--;
  }
  int np = it->np;
  if (np < 3)
    return BAD("--chaos: item %d \"%s\": %s needs a target, as in %s:worker:1, %s:rank:0 or %s:host:1 (and :MS or "
               ":until=S: how long; none: it lasts)", n, shown, a, a, a, a);
  int64_t v;
  if (strcmp(parts[1], "worker") == 0 || strcmp(parts[1], "rank") == 0) {
    e->target = CHAOS_WORKER;
    e->by_rank = parts[1][0] == 'r';
  } else if (strcmp(parts[1], "host") == 0) {
    e->target = CHAOS_HOST;
  } else {
    return BAD("--chaos: item %d \"%s\": %s applies to worker:I, rank:R or host:I", n, shown, a);
  }
  if (newt_parse_int(parts[2], &v) != 0 || v < 0 || v > 100000)
    return BAD("--chaos: item %d \"%s\": %s \"%s\" is not a number", n, shown, parts[1], parts[2]);
  e->index = (int)v;
  if (np == 4 && strncmp(parts[3], "until=", 6) == 0) {
    if (newt_parse_int(parts[3] + 6, &e->until_step) != 0 || e->until_step <= e->step)
      return BAD("--chaos: item %d \"%s\": \"%s\": %s is mended at a step after the item's own (%lld)", n, shown,
                 parts[3], what, (long long)e->step);
  } else if (np == 4 && (newt_parse_int(parts[3], &e->arg) != 0 || e->arg < 1 || e->arg > 3600000)) {
    return BAD("--chaos: item %d \"%s\": how long %s lasts, \"%s\", is not 1..3600000 ms", n, shown, what, parts[3]);
  }
  return NEWT_OK;
}

/* worker:I or rank:R (parts[1] says which). */
static newt_result_t parse_worker(chaos_item *it, chaos_event *e) {
  int64_t v;
  e->target = CHAOS_WORKER;
  e->by_rank = it->parts[1][0] == 'r';
  if (it->np != 3 || newt_parse_int(it->parts[2], &v) != 0 || v < 0 || v > 100000)
    return BAD("--chaos: item %d: %s \"%s\" is not a number", it->idx + 1, e->by_rank ? "rank" : "worker index",
               it->np > 2 ? it->parts[2] : "");
  e->index = (int)v;
  return NEWT_OK;
}

/* host:I, where the action has a row for a host. */
static newt_result_t parse_host(chaos_item *it, chaos_event *e) {
  int64_t v;
  int n = it->idx + 1;
  if (!kind_of(e->action, CHAOS_HOST))
    return BAD("--chaos: item %d \"%s\": only kill applies to a host (kill:host:I: every worker of simulated host "
               "I at once, newt run --hosts)", n, it->shown);
  e->target = CHAOS_HOST;
  if (it->np > 3)
    return BAD("--chaos: item %d \"%s\": kill:host takes one value, the host, as in kill:host:1", n, it->shown);
  if (it->np != 3 || newt_parse_int(it->parts[2], &v) != 0 || v < 0 || v > 1023)
    return BAD("--chaos: item %d \"%s\": host \"%s\" is not 0..1023 (a simulated host of newt run --hosts)", n,
               it->shown, it->np > 2 ? it->parts[2] : "");
  e->index = (int)v;
  return NEWT_OK;
}

/* coordinator [":" I]: the leader when I is left out. */
static newt_result_t parse_coordinator(chaos_item *it, chaos_event *e) {
  int64_t v;
  e->target = CHAOS_COORDINATOR;
  e->index = -1;
  if (it->np == 3 && (newt_parse_int(it->parts[2], &v) != 0 || v < 0 || v > 1000))
    return BAD("--chaos: item %d: coordinator index \"%s\" is not a number", it->idx + 1, it->parts[2]);
  if (it->np == 3) e->index = (int)v;
  if (it->np > 3) return BAD("--chaos: item %d: too many fields", it->idx + 1);
  return NEWT_OK;
}

/* kill, stop, term: worker:I, rank:R, host:I, coordinator[:I] or etcd... */
static newt_result_t parse_signal(chaos_item *it, chaos_event *e) {
  static const struct {
    const char *word;
    newt_result_t (*parse)(chaos_item *it, chaos_event *e);
  } targets[] = {{"etcd", parse_etcd}, {"rank", parse_worker}, {"worker", parse_worker}, {"host", parse_host},
                 {"coordinator", parse_coordinator}};
  if (it->np < 2)
    return BAD("--chaos: item %d: %s needs a target: worker:I, host:I or coordinator", it->idx + 1, it->parts[0]);
  for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
    if (strcmp(it->parts[1], targets[i].word) == 0) return targets[i].parse(it, e);
  return BAD("--chaos: item %d: unknown target \"%s\" (worker:I, rank:R, host:I or coordinator)", it->idx + 1,
             it->parts[1]);
}

/* cont: a worker only. */
static newt_result_t parse_cont(chaos_item *it, chaos_event *e) {
  if (it->np >= 2 && strcmp(it->parts[1], "rank") == 0)
    return BAD("--chaos: item %d: cont applies to worker:I (a stopped rank is no rank)", it->idx + 1);
  if (it->np >= 2 && strcmp(it->parts[1], "coordinator") == 0)
    return BAD("--chaos: item %d: cont applies to workers only", it->idx + 1);
  return parse_signal(it, e);
}

/* join:N */
static newt_result_t parse_join(chaos_item *it, chaos_event *e) {
  int64_t v;
  if (it->np != 2 || newt_parse_int(it->parts[1], &v) != 0 || v < 1 || v > 1024)
    return BAD("--chaos: item %d: join needs a count of workers 1..1024, as in join:2", it->idx + 1);
  e->target = CHAOS_WORKER;
  e->arg = v;
  e->index = -1;
  return NEWT_OK;
}

/* flip:rank:R[:TENSOR]@step=N */
static newt_result_t parse_flip(chaos_item *it, chaos_event *e) {
  char **parts = it->parts;
  int64_t v;
  int np = it->np, n = it->idx + 1;
  if (np < 3 || np > 4 || strcmp(parts[1], "rank") != 0 || newt_parse_int(parts[2], &v) != 0 || v < 0 || v > 100000)
    return BAD("--chaos: item %d \"%s\": flip applies to a rank, as in flip:rank:1@step=20 or "
               "flip:rank:1:wte@step=20 (a tensor of its state)", n, it->shown);
  if (e->ckpt_step || e->step < 1)
    return BAD("--chaos: item %d \"%s\": flip lands after a step (@step=N, N at least 1), armed in every worker "
               "at its start", n, it->shown);
  if (np == 4 && (strlen(parts[3]) >= sizeof e->tensor || strpbrk(parts[3], ";\"' ")))
    return BAD("--chaos: item %d \"%s\": \"%s\" is no tensor name", n, it->shown, parts[3]);
  e->target = CHAOS_WORKER;
  e->by_rank = 1;
  e->index = (int)v;
  if (np == 4) snprintf(e->tensor, sizeof e->tensor, "%s", parts[3]);
  return NEWT_OK;
}

/* slowcpu:(worker:I | rank:R):P%[:until=(S | rebalanced)] */
static newt_result_t parse_slowcpu(chaos_item *it, chaos_event *e) {
  char **parts = it->parts;
  int np = it->np, n = it->idx + 1;
  int64_t v, pct;
  char *end = NULL;
  if (np < 4 || (strcmp(parts[1], "worker") != 0 && strcmp(parts[1], "rank") != 0) ||
      newt_parse_int(parts[2], &v) != 0 || v < 0 || v > 100000)
    return BAD("--chaos: item %d \"%s\": slowcpu applies to worker:I or rank:R with the CPU time it keeps, as in "
               "slowcpu:worker:1:50%%@step=20 or slowcpu:rank:0:25%%:until=60@step=20", n, it->shown);
  e->target = CHAOS_WORKER;
  e->by_rank = parts[1][0] == 'r';
  e->index = (int)v;
  pct = strtoll(parts[3], &end, 10);
  if (end == parts[3] || strcmp(end, "%") != 0 || pct < 1 || pct > 99)
    return BAD("--chaos: item %d \"%s\": \"%s\": the CPU time the worker keeps is 1%%..99%%", n, it->shown, parts[3]);
  e->percent = (int)pct;
  e->until_rebalanced = np == 5 && strcmp(parts[4], "until=rebalanced") == 0;
  if (np == 5 && !e->until_rebalanced && (strncmp(parts[4], "until=", 6) != 0 || newt_parse_int(parts[4] + 6, &e->until_step) != 0 ||
                  e->until_step <= e->step))
    return BAD("--chaos: item %d \"%s\": \"%s\": the slowdown ends at a step after the item's own (%lld), as "
               "until=%lld, or once a plan answered it, as until=rebalanced", n, it->shown, parts[4],
               (long long)e->step, (long long)e->step + 20);
  return NEWT_OK;
}

/* --- printing: the item without its trigger ----------------------------------------------------- */

static void print_process(const chaos_kind *k, const chaos_event *e, char *buf, size_t cap) {
  if (e->target == CHAOS_HOST) snprintf(buf, cap, "%s:host:%d", k->name, e->index);
  else if (e->target == CHAOS_COORDINATOR && e->index < 0) snprintf(buf, cap, "%s:coordinator", k->name);
  else if (e->target == CHAOS_COORDINATOR) snprintf(buf, cap, "%s:coordinator:%d", k->name, e->index);
  else snprintf(buf, cap, "%s:%s:%d", k->name, e->by_rank ? "rank" : "worker", e->index);
}

static void print_etcd(const chaos_kind *k, const chaos_event *e, char *buf, size_t cap) {
  if (e->until_step) snprintf(buf, cap, "%s:etcd:until=%lld", k->name, (long long)e->until_step);
  else if (e->index < 0) snprintf(buf, cap, "%s:etcd:%lld", k->name, (long long)e->arg);
  else snprintf(buf, cap, "%s:etcd:%d:%lld", k->name, e->index, (long long)e->arg);
}

static void print_cut(const chaos_kind *k, const chaos_event *e, char *buf, size_t cap) {
  char len[64] = "";
  if (e->action == CHAOS_SLOW) snprintf(len, sizeof len, ":%lld", (long long)e->kbit);
  size_t at = strlen(len);
  if (e->until_step) snprintf(len + at, sizeof len - at, ":until=%lld", (long long)e->until_step);
  else if (e->arg) snprintf(len + at, sizeof len - at, ":%lld", (long long)e->arg);
  snprintf(buf, cap, "%s:%s:%d%s", k->name, e->target == CHAOS_HOST ? "host" : e->by_rank ? "rank" : "worker",
           e->index, len);
}

static void print_join(const chaos_kind *k, const chaos_event *e, char *buf, size_t cap) {
  snprintf(buf, cap, "%s:%lld", k->name, (long long)e->arg);
}

static void print_slowcpu(const chaos_kind *k, const chaos_event *e, char *buf, size_t cap) {
  char until[32] = "";
  if (e->until_step) snprintf(until, sizeof until, ":until=%lld", (long long)e->until_step);
  if (e->until_rebalanced) snprintf(until, sizeof until, ":until=rebalanced");
  snprintf(buf, cap, "%s:%s:%d:%d%%%s", k->name, e->by_rank ? "rank" : "worker", e->index, e->percent, until);
}

static void print_flip(const chaos_kind *k, const chaos_event *e, char *buf, size_t cap) {
  snprintf(buf, cap, "%s:rank:%d%s%s", k->name, e->index, e->tensor[0] ? ":" : "", e->tensor);
}

/* --- the table ------------------------------------------------------------------------------------ */

#define W CHAOS_WORKER
#define C CHAOS_COORDINATOR
#define H CHAOS_HOST
#define E CHAOS_ETCD
#define N_ETCD CHAOS_NEEDS_ETCD
#define N_NET CHAOS_NEEDS_NETNS
#define N_HOSTS CHAOS_NEEDS_HOSTS
#define N_PLAN CHAOS_NEEDS_PLAN

/* Grouped by what they act on: processes, the network, etcd (mends run in this order: a cut
 * is mended before etcd comes back). Each row is two lines:
 *   name, action, target, grammar, most ':' fields, what a missing --hosts is said as;
 *   parse, print, needs, fire, mend, answer.
 * The first row of an action reads all its items. */
static const chaos_kind chaos_kinds[] = {
  /* processes */
  {"kill",     CHAOS_KILL,     W, "worker:I | rank:R",                        4, NULL,
   parse_signal,    print_process, N_PLAN,          inject_fire_signal, NULL,             CHAOS_ANSWER_CRASH},
  {"kill",     CHAOS_KILL,     C, "coordinator[:I]",                          4, NULL,
   parse_signal,    print_process, 0,               inject_fire_signal, NULL,             CHAOS_ANSWER_LEADER},
  {"kill",     CHAOS_KILL,     H, "host:I",                                   4, "a host to kill needs --hosts H",
   parse_signal,    print_process, N_HOSTS,         inject_fire_host,   NULL,             CHAOS_ANSWER_CRASH},
  {"stop",     CHAOS_STOP,     W, "worker:I | rank:R",                        4, NULL,
   parse_signal,    print_process, N_PLAN,          inject_fire_signal, NULL,             CHAOS_ANSWER_CRASH},
  {"stop",     CHAOS_STOP,     C, "coordinator[:I]",                          4, NULL,
   parse_signal,    print_process, 0,               inject_fire_signal, NULL,             CHAOS_ANSWER_LEADER},
  {"term",     CHAOS_TERM,     W, "worker:I | rank:R",                        4, NULL,
   parse_signal,    print_process, N_PLAN,          inject_fire_signal, NULL,             CHAOS_ANSWER_LEAVE},
  {"term",     CHAOS_TERM,     C, "coordinator[:I]",                          4, NULL,
   parse_signal,    print_process, 0,               inject_fire_signal, NULL,             CHAOS_ANSWER_LEADER},
  {"cont",     CHAOS_CONT,     W, "worker:I",                                 4, NULL,
   parse_cont,      print_process, N_PLAN,          inject_fire_signal, NULL,             CHAOS_ANSWER_WAKE},
  {"join",     CHAOS_JOIN,     W, "N",                                        4, NULL,
   parse_join,      print_join,    0,               inject_fire_join,   NULL,             CHAOS_ANSWER_JOINERS},
  {"flip",     CHAOS_FLIP,     W, "rank:R[:TENSOR]",                          4, NULL,
   parse_flip,      print_flip,    N_PLAN,          inject_fire_flip,   NULL,             CHAOS_ANSWER_NONE},
  {"slowcpu",  CHAOS_SLOWCPU,  W, "(worker:I | rank:R):P%[:until=S|rebalanced]", 5, NULL,
   parse_slowcpu,   print_slowcpu, N_PLAN,          inject_fire_slowcpu, inject_mend_slowcpu, CHAOS_ANSWER_REBALANCE},
  /* the network (newt run --netns) */
  {"cut",      CHAOS_CUT,      W, "(worker:I | rank:R)[:MS | :until=S]",      4, NULL,
   parse_cut,       print_cut,     N_NET | N_PLAN,  inject_fire_cut,    inject_mend_cuts, CHAOS_ANSWER_CRASH},
  {"cut",      CHAOS_CUT,      H, "host:I[:MS | :until=S]",                   4, "a host target needs --hosts H",
   parse_cut,       print_cut,     N_NET | N_HOSTS, inject_fire_cut,    inject_mend_cuts, CHAOS_ANSWER_CRASH},
  {"cut-etcd", CHAOS_CUT_ETCD, W, "(worker:I | rank:R)[:MS | :until=S]",      4, NULL,
   parse_cut,       print_cut,     N_NET | N_PLAN,  inject_fire_cut,    inject_mend_cuts, CHAOS_ANSWER_NONE},
  {"cut-etcd", CHAOS_CUT_ETCD, H, "host:I[:MS | :until=S]",                   4, "a host target needs --hosts H",
   parse_cut,       print_cut,     N_NET | N_HOSTS, inject_fire_cut,    inject_mend_cuts, CHAOS_ANSWER_NONE},
  /* a slow link may stall its ranks past the hang deadline (a hang), or not (no recovery) */
  {"slow",     CHAOS_SLOW,     W, "(worker:I | rank:R):KBIT[:MS | :until=S]", 5, NULL,
   parse_cut,       print_cut,     N_NET | N_PLAN,  inject_fire_cut,    inject_mend_cuts, CHAOS_ANSWER_CRASH},
  {"slow",     CHAOS_SLOW,     H, "host:I:KBIT[:MS | :until=S]",              5, "a host target needs --hosts H",
   parse_cut,       print_cut,     N_NET | N_HOSTS, inject_fire_cut,    inject_mend_cuts, CHAOS_ANSWER_CRASH},
  /* etcd (the private one) */
  {"kill",     CHAOS_KILL,     E, "etcd:I[:MS]",                              4, NULL,
   parse_signal,    print_etcd,    N_ETCD,          inject_fire_etcd,   inject_etcd_tick, CHAOS_ANSWER_ETCD},
  {"stop",     CHAOS_STOP,     E, "etcd[:MS | :until=S] | etcd:I:MS",         4, NULL,
   parse_signal,    print_etcd,    N_ETCD,          inject_fire_etcd,   inject_etcd_tick, CHAOS_ANSWER_ETCD},
  {"restart",  CHAOS_RESTART,  E, "etcd[:MS | :until=S]",                     4, NULL,
   parse_etcd_only, print_etcd,    N_ETCD,          inject_fire_etcd,   inject_etcd_tick, CHAOS_ANSWER_ETCD},
  {"wipe",     CHAOS_WIPE,     E, "etcd[:MS]",                                4, NULL,
   parse_etcd_only, print_etcd,    N_ETCD,          inject_fire_etcd,   inject_etcd_tick, CHAOS_ANSWER_ETCD},
};
#define NKINDS (sizeof chaos_kinds / sizeof chaos_kinds[0])

/* The row of an action on a target (NULL: it does not apply there). */
static const chaos_kind *kind_of(chaos_action action, chaos_target target) {
  for (size_t i = 0; i < NKINDS; i++)
    if (chaos_kinds[i].action == action && chaos_kinds[i].target == target) return &chaos_kinds[i];
  return NULL;
}

/* The first row of an action named name, or of action (NULL: none). */
static const chaos_kind *kind_named(const char *name) {
  for (size_t i = 0; i < NKINDS; i++)
    if (strcmp(chaos_kinds[i].name, name) == 0) return &chaos_kinds[i];
  return NULL;
}
static const char *action_name(chaos_action action) {
  for (size_t i = 0; i < NKINDS; i++)
    if (chaos_kinds[i].action == action) return chaos_kinds[i].name;
  return NULL;
}

/* --- parsing ---------------------------------------------------------------------------------------- */

/* "unknown action": the actions in the order of chaos_action. */
static newt_result_t unknown_action(const chaos_item *it) {
  char names[256] = "";
  for (int a = 0; action_name((chaos_action)a); a++) newt_list_add(names, sizeof names, action_name((chaos_action)a));
  return BAD("--chaos: item %d: unknown action \"%s\" (%s)", it->idx + 1, it->parts[0], names);
}

/* The trigger, "@step=N" or "@ckpt=N", cut off item into e. */
static newt_result_t parse_trigger(char *item, int idx, chaos_event *e) {
  char *at = strstr(item, "@step="), *ck = strstr(item, "@ckpt=");
  if (!at && !ck) return BAD("--chaos: item %d \"%s\": missing \"@step=N\" (or \"@ckpt=N\")", idx + 1, item);
  if (!at) at = ck;
  *at = '\0';
  const char *steps = at + 6;
  int64_t *when = at == ck ? &e->ckpt_step : &e->step;
  if (newt_parse_int(steps, when) != 0 || *when < (at == ck ? 1 : 0))
    return BAD("--chaos: item %d: %s \"%s\" is not a %s integer", idx + 1, at == ck ? "checkpoint step" : "step",
               steps, at == ck ? "positive" : "non-negative");
  return NEWT_OK;
}

static newt_result_t parse_item(char *item, int idx, chaos_event *e) {
  memset(e, 0, sizeof *e);
  newt_result_t res = parse_trigger(item, idx, e);
  if (res != NEWT_OK) return res;
  chaos_item it = {.idx = idx};
  snprintf(it.shown, sizeof it.shown, "%s", item);
  const chaos_kind *k = NULL;
  for (char *save = NULL, *tok = strtok_r(item, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
    if (it.np == (k ? k->fields : 4)) return BAD("--chaos: item %d \"%s\": too many ':' fields", idx + 1, item);
    it.parts[it.np++] = tok;
    if (it.np == 1) k = kind_named(tok);
  }
  if (it.np == 0) return BAD("--chaos: item %d is empty", idx + 1);
  if (!k) return unknown_action(&it);
  e->action = k->action;
  return k->parse(&it, e);
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

const char *chaos_event_str(const chaos_event *e, char *buf, size_t cap) {
  const chaos_kind *k = kind_of(e->action, e->target);
  if (k) k->print(k, e, buf, cap);
  else snprintf(buf, cap, "%s", action_name(e->action) ? action_name(e->action) : "?");
  size_t at = strlen(buf);
  if (at < cap)
    snprintf(buf + at, cap - at, e->ckpt_step ? "@ckpt=%lld" : "@step=%lld",
             (long long)(e->ckpt_step ? e->ckpt_step : e->step));
  return buf;
}

/* --- what a run must offer ------------------------------------------------------------------------- */

newt_result_t chaos_check_needs(const launcher_opts *o, unsigned which) {
  for (int i = 0; i < o->chaos.n; i++) {
    const chaos_event *e = &o->chaos.events[i];
    const chaos_kind *k = kind_of(e->action, e->target);
    unsigned needs = ((k ? k->needs : 0) | (e->ckpt_step ? CHAOS_NEEDS_CKPT : 0)) & which;
    char item[64];
    if (needs & CHAOS_NEEDS_ETCD && o->etcd)
      return BAD("--chaos %s: needs the private etcd (leave out --etcd)", chaos_event_str(e, item, sizeof item));
    if (needs & CHAOS_NEEDS_NETNS && !o->netns)
      return BAD("--chaos %s: needs --netns (each host in a network namespace: root)",
                 chaos_event_str(e, item, sizeof item));
    if (needs & CHAOS_NEEDS_CKPT && (!o->spec.ckpt_dir[0] || o->spec.ckpt_every < 1))
      return BAD("--chaos %s: the job writes no checkpoints (--ckpt-dir and --ckpt-every): it would never fire",
                 chaos_event_str(e, item, sizeof item));
    if (needs & CHAOS_NEEDS_HOSTS && e->index >= o->hosts)
      return BAD("--chaos %s: %s", chaos_event_str(e, item, sizeof item),
                 o->hosts ? "no such simulated host (--hosts counts from host0)"
                          : k->want);
  }
  return NEWT_OK;
}

chaos_answer chaos_event_answer(const chaos_event *e) {
  const chaos_kind *k = kind_of(e->action, e->target);
  return k ? k->answer : CHAOS_ANSWER_NONE;
}

/* --- firing and mending ---------------------------------------------------------------------------- */

/* Fires one item through its row; the faults it recorded are answered as the row says (none:
 * matched at once). */
static void fire(run *r, chaos_event *e, const newt_plan *plan) {
  const chaos_kind *k = kind_of(e->action, e->target);
  char what[64];
  chaos_event_str(e, what, sizeof what);
  e->fired = 1;
  if (!k) return;
  int first = r->nfaults;
  int fired = k->fire(r, e, plan, what); /* fired, with nothing said of it yet */
  for (int i = first; i < r->nfaults; i++) {
    r->faults[i].answer = k->answer;
    if (k->answer == CHAOS_ANSWER_NONE) r->faults[i].matched = 1;
  }
  if (fired && !r->o->quiet) fprintf(stderr, "%snewt run: chaos: %s\n", live_news(r), what);
}

/* Whether e is due: its step completed, and its checkpoint (@ckpt) committed (ckpt: the
 * newest committed checkpoint's step, -1: none). */
static int is_due(const chaos_event *e, int64_t step, int64_t ckpt) {
  return !e->fired && step >= e->step && (!e->ckpt_step || ckpt >= e->ckpt_step);
}

void chaos_fire_due(run *r, int64_t step) {
  pthread_mutex_lock(&r->mu); /* the watch's thread adds checkpoints */
  int64_t ckpt = r->res->nckpts ? r->res->ckpts[r->res->nckpts - 1].step : -1;
  pthread_mutex_unlock(&r->mu);
  int due = 0, read_plan = 0; /* the plan in force is read once for the faults due together */
  for (int i = 0; i < r->nchaos; i++) {
    const chaos_kind *k = kind_of(r->chaos[i].action, r->chaos[i].target);
    if (is_due(&r->chaos[i], step, ckpt)) due = 1, read_plan |= k && k->needs & CHAOS_NEEDS_PLAN;
  }
  newt_plan before, *plan = read_plan ? follow_plan(r, &before) : NULL;
  for (int i = 0; due && i < r->nchaos; i++)
    if (is_due(&r->chaos[i], step, ckpt)) fire(r, &r->chaos[i], plan);
  if (plan) plan_free(plan);
}

void chaos_end(run *r) { inject_mend_slowcpu(r, -1); }

void chaos_mend(run *r, int64_t step) {
  for (size_t i = 0; i < NKINDS; i++) {
    int earlier = 0; /* rows share a mend: it runs once */
    for (size_t j = 0; j < i; j++) earlier |= chaos_kinds[j].mend == chaos_kinds[i].mend;
    if (chaos_kinds[i].mend && !earlier) chaos_kinds[i].mend(r, step);
  }
}
