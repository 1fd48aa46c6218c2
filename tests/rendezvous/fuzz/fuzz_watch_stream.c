/* libFuzzer target: a watch stream from a hostile server. The input is cut into chunks
 * (sizes taken from the input itself, as HTTP chunks and reads would cut it), fed to the
 * line splitter, and every line goes to the watch message parser, exactly as the client's
 * watch thread does. Nothing may crash, leak or read out of bounds. */
#include <stddef.h>
#include <stdint.h>

#include "rendezvous/etcd_parse.h"

static newt_result_t on_line(void *ud, const char *line, size_t len) {
  rdzv_etcd_watch_msg m;
  if (rdzv_etcd_parse_watch(line, len, &m) == NEWT_OK) {
    for (size_t i = 0; i < m.n_events; i++) (*(size_t *)ud) += m.events[i].kv.key_len + m.events[i].kv.value_len;
    rdzv_etcd_watch_msg_free(&m);
  }
  return NEWT_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t step = (size_t)(data[0] % 61) + 1;
  rdzv_etcd_lines l;
  rdzv_etcd_lines_init(&l, 4096); /* small, so the line limit is reached too */
  size_t sink = 0;
  const char *p = (const char *)data + 1;
  size_t left = size - 1;
  while (left > 0) {
    size_t n = step < left ? step : left;
    if (rdzv_etcd_lines_feed(&l, p, n, on_line, &sink) != NEWT_OK) rdzv_etcd_lines_reset(&l);
    p += n;
    left -= n;
    step = step * 7 % 61 + 1;
  }
  rdzv_etcd_lines_free(&l);
  return 0;
}
