/* Auth and TLS against real etcd servers started here: a user with a password (and a
 * token that expires after 1 s, so re-authentication is exercised), https with a CA made
 * by the test (gen_certs.sh), and mTLS. Wrong passwords and wrong CAs must fail with
 * messages that say what is wrong. */
#include <pthread.h>
#include <string.h>

#include "rdzv_test.h"

static char certs[512];

static newt_deadline_t dl(int64_t ms) { return newt_deadline_in_ms(ms); }

static void on_event(void *ud, const rdzv_etcd_watch_resp *r) {
  if (r->kind == RDZV_WATCH_EVENTS) atomic_fetch_add((atomic_int *)ud, (int)r->n_events);
}

static int wait_count(atomic_int *n, int want) {
  for (int i = 0; i < 250 && atomic_load(n) < want; i++) newt_sleep_ms(20);
  return atomic_load(n) >= want;
}

static void test_auth(void) {
  rdzv_etcd_server_opts so = {.root_password = "s3cret", .auth_token_ttl_s = 1};
  rdzv_etcd_server *s = tu_server(&so);
  rdzv_etcd_opts o;
  rdzv_etcd_server_client_opts(s, &o);
  rdzv_etcd *c = tu_client_opts(&o);
  T_OK(rdzv_etcd_put(c, "/auth/k", "v", 1, 0, dl(5000), NULL));
  atomic_int events = 0;
  rdzv_etcd_watch *w = NULL;
  T_OK(rdzv_etcd_watch_start(c, "/auth/", &(rdzv_etcd_watch_opts){.prefix = 1}, on_event, &events, dl(5000), &w));
  /* the simple token expires after 1 s of disuse: the client must trade the password again */
  newt_sleep_ms(2500);
  T_OK(rdzv_etcd_put(c, "/auth/k", "v2", 2, 0, dl(5000), NULL));
  rdzv_etcd_kv kv;
  T_OK(rdzv_etcd_get(c, "/auth/k", dl(5000), &kv, NULL));
  T_CHECK(kv.value_len == 2);
  rdzv_etcd_kv_free(&kv);
  T_CHECK(wait_count(&events, 1));
  rdzv_etcd_watch_free(w);
  /* a lease kept alive under auth */
  int64_t lease = 0, ttl = 0;
  T_OK(rdzv_etcd_lease_grant(c, 5, 0, dl(5000), &lease, NULL));
  T_OK(rdzv_etcd_lease_ttl(c, lease, dl(5000), &ttl, NULL));
  rdzv_etcd_free(c);

  /* wrong password */
  o.password = "wrong";
  c = tu_client_opts(&o);
  newt_result_t r = rdzv_etcd_put(c, "/auth/k", "x", 1, 0, dl(5000), NULL);
  T_CHECK(r == NEWT_ERR_AUTH);
  fprintf(stderr, "  wrong password: %s\n", newt_errmsg());
  T_CHECK(strstr(newt_errmsg(), "authentication failed") && strstr(newt_errmsg(), "root") &&
          strstr(newt_errmsg(), rdzv_etcd_server_url(s)));
  T_ERR(NEWT_ERR_AUTH, rdzv_etcd_watch_start(c, "/auth/", NULL, NULL, NULL, dl(2000), &w));
  rdzv_etcd_free(c);
  /* no user at all */
  o.user = NULL;
  c = tu_client_opts(&o);
  T_ERR(NEWT_ERR_AUTH, rdzv_etcd_put(c, "/auth/k", "x", 1, 0, dl(5000), NULL));
  fprintf(stderr, "  no user: %s\n", newt_errmsg());
  rdzv_etcd_free(c);
  rdzv_etcd_server_free(s);
}

static void test_tls(void) {
  char cert[600], key[600], ca[600], other[600], ccert[600], ckey[600];
  snprintf(cert, sizeof cert, "%s/server.pem", certs);
  snprintf(key, sizeof key, "%s/server.key", certs);
  snprintf(ca, sizeof ca, "%s/ca.pem", certs);
  snprintf(other, sizeof other, "%s/other-ca.pem", certs);
  snprintf(ccert, sizeof ccert, "%s/client.pem", certs);
  snprintf(ckey, sizeof ckey, "%s/client.key", certs);
  rdzv_etcd_server_opts so = {.tls_cert = cert, .tls_key = key, .tls_ca = ca};
  rdzv_etcd_server *s = tu_server(&so);
  T_CHECK(strncmp(rdzv_etcd_server_url(s), "https://", 8) == 0);
  rdzv_etcd_opts o = {.endpoints = rdzv_etcd_server_url(s), .ca_file = ca};
  rdzv_etcd *c = tu_client_opts(&o);
  T_OK(rdzv_etcd_put(c, "/tls/k", "v", 1, 0, dl(5000), NULL));
  atomic_int events = 0;
  rdzv_etcd_watch *w = NULL;
  T_OK(rdzv_etcd_watch_start(c, "/tls/", &(rdzv_etcd_watch_opts){.prefix = 1}, on_event, &events, dl(5000), &w));
  T_OK(rdzv_etcd_put(c, "/tls/k", "v2", 2, 0, dl(5000), NULL));
  T_CHECK(wait_count(&events, 1));
  rdzv_etcd_watch_free(w);
  rdzv_etcd_free(c);
  /* the wrong CA */
  o.ca_file = other;
  c = tu_client_opts(&o);
  T_ERR(NEWT_ERR_AUTH, rdzv_etcd_put(c, "/tls/k", "v", 1, 0, dl(5000), NULL));
  fprintf(stderr, "  wrong CA: %s\n", newt_errmsg());
  T_CHECK(strstr(newt_errmsg(), "TLS") && strstr(newt_errmsg(), other) && strstr(newt_errmsg(), rdzv_etcd_server_url(s)));
  T_ERR(NEWT_ERR_AUTH, rdzv_etcd_watch_start(c, "/tls/", NULL, NULL, NULL, dl(2000), &w));
  rdzv_etcd_free(c);
  rdzv_etcd_server_free(s);

  /* mTLS: a client certificate from the CA is required */
  rdzv_etcd_server_opts mo = {.tls_cert = cert, .tls_key = key, .tls_ca = ca, .client_cert_auth = 1,
                              .client_cert = ccert, .client_key = ckey};
  s = tu_server(&mo);
  rdzv_etcd_opts with = {.endpoints = rdzv_etcd_server_url(s), .ca_file = ca, .cert_file = ccert, .key_file = ckey};
  c = tu_client_opts(&with);
  T_OK(rdzv_etcd_put(c, "/mtls/k", "v", 1, 0, dl(5000), NULL));
  rdzv_etcd_kv kv;
  T_OK(rdzv_etcd_get(c, "/mtls/k", dl(5000), &kv, NULL));
  rdzv_etcd_kv_free(&kv);
  rdzv_etcd_free(c);
  rdzv_etcd_opts without = {.endpoints = rdzv_etcd_server_url(s), .ca_file = ca};
  c = tu_client_opts(&without);
  T_ERR(NEWT_ERR_AUTH, rdzv_etcd_put(c, "/mtls/k", "v", 1, 0, dl(5000), NULL));
  fprintf(stderr, "  no client certificate: %s\n", newt_errmsg());
  rdzv_etcd_free(c);
  rdzv_etcd_server_free(s);
}

/* mTLS and a user with a password at once (what the chart's TLS values set up; issue 17,
 * item 10): etcd's gateway refuses a client certificate with a Common Name then
 * (CVE-2018-16886), so the certificate carries none and the user and password are the
 * identity. A wrong password and a certificate with a CN each fail saying which. */
static void test_mtls_auth(void) {
  char cert[600], key[600], ca[600], ccert[600], ckey[600];
  snprintf(cert, sizeof cert, "%s/server.pem", certs);
  snprintf(key, sizeof key, "%s/server.key", certs);
  snprintf(ca, sizeof ca, "%s/ca.pem", certs);
  snprintf(ccert, sizeof ccert, "%s/client.pem", certs);
  snprintf(ckey, sizeof ckey, "%s/client.key", certs);
  rdzv_etcd_server_opts mo = {.tls_cert = cert, .tls_key = key, .tls_ca = ca, .client_cert_auth = 1,
                              .client_cert = ccert, .client_key = ckey, .root_password = "s3cret"};
  rdzv_etcd_server *s = tu_server(&mo);
  rdzv_etcd_opts o = {.endpoints = rdzv_etcd_server_url(s), .ca_file = ca, .cert_file = ccert, .key_file = ckey,
                      .user = "root", .password = "s3cret"};
  rdzv_etcd *c = tu_client_opts(&o);
  T_OK(rdzv_etcd_put(c, "/both/k", "v", 1, 0, dl(5000), NULL));
  rdzv_etcd_kv kv;
  T_OK(rdzv_etcd_get(c, "/both/k", dl(5000), &kv, NULL));
  rdzv_etcd_kv_free(&kv);
  rdzv_etcd_free(c);
  o.password = "wrong";
  c = tu_client_opts(&o);
  T_ERR(NEWT_ERR_AUTH, rdzv_etcd_put(c, "/both/k", "v", 1, 0, dl(5000), NULL));
  fprintf(stderr, "  wrong password: %s\n", newt_errmsg());
  T_CHECK_MSG(strstr(newt_errmsg(), "password") != NULL && !strstr(newt_errmsg(), "Common Name"),
              "the error does not say the password is wrong: %s", newt_errmsg());
  rdzv_etcd_free(c);
  char cncert[600], cnkey[600];
  snprintf(cncert, sizeof cncert, "%s/client-cn.pem", certs);
  snprintf(cnkey, sizeof cnkey, "%s/client-cn.key", certs);
  o.password = "s3cret";
  o.cert_file = cncert;
  o.key_file = cnkey;
  c = tu_client_opts(&o);
  T_ERR(NEWT_ERR_AUTH, rdzv_etcd_put(c, "/both/k", "v", 1, 0, dl(5000), NULL));
  fprintf(stderr, "  a certificate with a CN: %s\n", newt_errmsg());
  T_CHECK_MSG(strstr(newt_errmsg(), "Common Name") && strstr(newt_errmsg(), cncert),
              "the error does not name the certificate and its Common Name: %s", newt_errmsg());
  rdzv_etcd_free(c);
  rdzv_etcd_server_free(s);
}

int main(void) {
  tu_tmpdir(certs, sizeof certs, "certs");
  if (tu_gen_certs(certs) != 0) return 1;
  T_RUN(test_auth);
  T_RUN(test_tls);
  T_RUN(test_mtls_auth);
  newt_fs_rm_rf(certs);
  return T_DONE();
}
