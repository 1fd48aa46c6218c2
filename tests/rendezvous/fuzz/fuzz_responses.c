/* libFuzzer target: the unary answers of a hostile or broken server. The first byte picks
 * the parser (range, txn, lease, put/delete, error body, one watch message); the rest is
 * the body. Every parser must return a result code, never crash or leak. */
#include <stddef.h>
#include <stdint.h>

#include "rendezvous/etcd_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *body = (const char *)data + 1;
  size_t len = size - 1;
  switch (data[0] % 6) {
    case 0: {
      rdzv_etcd_kvs r;
      if (rdzv_etcd_parse_range(body, len, &r) == NEWT_OK) rdzv_etcd_kvs_free(&r);
      break;
    }
    case 1: {
      rdzv_etcd_txn_result t;
      if (rdzv_etcd_parse_txn(body, len, &t) == NEWT_OK) rdzv_etcd_txn_result_free(&t);
      break;
    }
    case 2: {
      int64_t id, ttl, granted;
      rdzv_etcd_parse_lease(body, len, &id, &ttl, &granted);
      break;
    }
    case 3: {
      int64_t rev, deleted;
      rdzv_etcd_parse_write(body, len, &rev, &deleted);
      break;
    }
    case 4: {
      rdzv_etcd_gw_error e;
      rdzv_etcd_parse_error(body, len, &e);
      rdzv_etcd_grpc_code_result(e.grpc_code, e.message);
      break;
    }
    default: {
      rdzv_etcd_watch_msg m;
      if (rdzv_etcd_parse_watch(body, len, &m) == NEWT_OK) rdzv_etcd_watch_msg_free(&m);
      break;
    }
  }
  return 0;
}
