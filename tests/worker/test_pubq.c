/* The publisher's queue (worker/pubq.c): the newest value of a key wins, and a value whose
 * write failed never goes back behind a newer one of its key. The last case is the one an
 * etcd outage at a job's end made: the progress of step 127 in flight, the last step's
 * queued in another slot meanwhile, the old one given back beside it and written after the
 * end marker, so the job's progress record went back from step 400 to 127. */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "worker/pubq.h"

static char *dup_s(const char *s) {
  char *d = strdup(s);
  if (!d) abort();
  return d;
}

/* Takes every queued value in order; the values joined with ',' into out. */
static void drain(worker_pubq *q, char *out, size_t cap) {
  out[0] = '\0';
  worker_pub_item it;
  while (worker_pubq_take(q, &it)) {
    if (out[0]) strncat(out, ",", cap - strlen(out) - 1);
    strncat(out, it.key, cap - strlen(out) - 1);
    strncat(out, "=", cap - strlen(out) - 1);
    strncat(out, it.value, cap - strlen(out) - 1);
    free(it.value);
  }
}

static void test_newest_wins(void) {
  worker_pubq q;
  memset(&q, 0, sizeof q);
  T_CHECK(!worker_pubq_pending(&q));
  T_CHECK(worker_pubq_put(&q, "progress", dup_s("1"), 0) == 0);
  T_CHECK(worker_pubq_put(&q, "ckpt", dup_s("a"), 0) == 0);
  T_CHECK(worker_pubq_put(&q, "progress", dup_s("2"), 0) == 0);
  T_CHECK(worker_pubq_pending(&q));
  char got[256];
  drain(&q, got, sizeof got);
  T_CHECK_MSG(strcmp(got, "progress=2,ckpt=a") == 0, "queued: %s", got);
  T_CHECK(!worker_pubq_pending(&q));
}

static void test_retry_kept(void) {
  worker_pubq q;
  memset(&q, 0, sizeof q);
  T_CHECK(worker_pubq_put(&q, "links", dup_s("l"), 1) == 0);
  worker_pub_item it;
  T_CHECK(worker_pubq_take(&q, &it) && it.on_lease == 1);
  T_CHECK(worker_pubq_retry(&q, &it) == 1); /* nothing newer: tried again */
  T_CHECK(it.value == NULL);
  T_CHECK(worker_pubq_take(&q, &it) && strcmp(it.value, "l") == 0 && it.on_lease == 1);
  free(it.value);
}

static void test_retry_behind_newer(void) {
  worker_pubq q;
  memset(&q, 0, sizeof q);
  T_CHECK(worker_pubq_put(&q, "ckpt", dup_s("a"), 0) == 0);        /* slot 0 */
  T_CHECK(worker_pubq_put(&q, "progress", dup_s("127"), 0) == 0);  /* slot 1 */
  worker_pub_item ck, old;
  T_CHECK(worker_pubq_take(&q, &ck) && strcmp(ck.key, "ckpt") == 0); /* written: slot 0 free */
  free(ck.value);
  T_CHECK(worker_pubq_take(&q, &old) && strcmp(old.value, "127") == 0); /* in flight, etcd away */
  T_CHECK(worker_pubq_put(&q, "progress", dup_s("400"), 0) == 0);  /* the newest, in slot 0 */
  T_CHECK_MSG(worker_pubq_retry(&q, &old) == 0, "the older value was kept beside the newer one");
  T_CHECK(old.value == NULL);
  char got[256];
  drain(&q, got, sizeof got);
  T_CHECK_MSG(strcmp(got, "progress=400") == 0, "written after the outage: %s", got);
}

static void test_full(void) {
  worker_pubq q;
  memset(&q, 0, sizeof q);
  char key[16];
  for (int i = 0; i < WORKER_PUB_SLOTS; i++) {
    snprintf(key, sizeof key, "k%d", i);
    T_CHECK(worker_pubq_put(&q, key, dup_s("v"), 0) == 0);
  }
  T_CHECK(worker_pubq_put(&q, "one-too-many", dup_s("v"), 0) == -1);
  worker_pub_item it;
  T_CHECK(worker_pubq_take(&q, &it));
  T_CHECK(worker_pubq_put(&q, "other", dup_s("v"), 0) == 0); /* takes the freed slot */
  T_CHECK(worker_pubq_retry(&q, &it) == -1 && it.value == NULL);
  worker_pubq_free(&q);
  T_CHECK(!worker_pubq_pending(&q));
}

int main(void) {
  T_RUN(test_newest_wins);
  T_RUN(test_retry_kept);
  T_RUN(test_retry_behind_newer);
  T_RUN(test_full);
  return T_DONE();
}
