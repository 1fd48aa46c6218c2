/* Unit tests of common/: base64, sizes, JSON field access, atomic files (and files in a
 * directory others write: links and FIFOs planted under the names used), flags, processes,
 * deadlines. */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/log.h"
#include "common/opts.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "test.h"

/* An error message that quotes the one below it (NEWT_ERR(..., "...: %s", newt_errmsg()), the
 * common shape), and one that quotes a record's control bytes. */
static void test_errmsg(void) {
  NEWT_ERR(NEWT_ERR_TIMEOUT, "lease %s expired", "49ca234b0df7019");
  NEWT_ERR(NEWT_ERR_CONFLICT, "c0 lost leadership: %s", newt_errmsg());
  T_CHECK_MSG(strcmp(newt_errmsg(), "c0 lost leadership: lease 49ca234b0df7019 expired") == 0, "got \"%s\"",
              newt_errmsg());
  NEWT_ERR(NEWT_ERR_INVALID, "plan.cause: \"%s\"", "x\x1b[2J\ny\x7f");
  T_CHECK_MSG(strcmp(newt_errmsg(), "plan.cause: \"x?[2J?y?\"") == 0, "got \"%s\"", newt_errmsg());
  char out[8];
  T_CHECK(strcmp(newt_str_printable(out, sizeof out, "a\tb\x1b[31mzzz"), "a?b?[31") == 0);
  /* C1 controls too (issue 37, item 9): CSI as UTF-8 (C2 9B) and as a raw byte, NEL (C2 85):
     each one '?'; every byte of an overlong CSI (E0 82 9B) or a cut sequence a '?'; well-formed
     UTF-8 is kept */
  NEWT_ERR(NEWT_ERR_INVALID, "why: \"%s\"", "a\xc2\x9b" "2J b\x9b" "2J c\xc2\x85 d\xe0\x82\x9b \xe2\x80\x9cok\xe2\x80\x9d \xf0\x9f\x90\xa2 \xe2\x80");
  T_CHECK_MSG(strcmp(newt_errmsg(), "why: \"a?2J b?2J c? d??? \xe2\x80\x9cok\xe2\x80\x9d \xf0\x9f\x90\xa2 ??\"") == 0, "got \"%s\"",
              newt_errmsg());
  char wide[64];
  T_CHECK_MSG(strcmp(newt_str_printable(wide, sizeof wide, "x\xc2\x9b[2Jy\x9b" "31m\xc2\xa0z"), "x?[2Jy?31m\xc2\xa0z") == 0,
              "got \"%s\"", wide);
  char list[12] = "";
  newt_list_add(list, sizeof list, "w1");
  newt_list_add(list, sizeof list, "w22");
  T_CHECK_MSG(strcmp(list, "w1, w22") == 0, "got \"%s\"", list);
  newt_list_add(list, sizeof list, "w333"); /* cut to fit, NUL-terminated */
  newt_list_add(list, sizeof list, "w4");   /* full: nothing more */
  T_CHECK_MSG(strcmp(list, "w1, w22, w3") == 0, "got \"%s\"", list);
}

static void test_base64(void) {
  const char *cases[][2] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                            {"foo", "Zm9v"},  {"foob", "Zm9vYg=="},  {"fooba", "Zm9vYmE="},
                            {"foobar", "Zm9vYmFy"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *e = newt_base64_encode_alloc(cases[i][0], strlen(cases[i][0]));
    T_CHECK_MSG(strcmp(e, cases[i][1]) == 0, "encode(%s) = %s", cases[i][0], e);
    size_t n = 0;
    char *d = newt_base64_decode_alloc(e, strlen(e), &n);
    T_CHECK(d && n == strlen(cases[i][0]) && memcmp(d, cases[i][0], n) == 0);
    free(e);
    free(d);
  }
  unsigned char all[256];
  for (int i = 0; i < 256; i++) all[i] = (unsigned char)i;
  char *e = newt_base64_encode_alloc(all, sizeof all);
  size_t n;
  char *d = newt_base64_decode_alloc(e, strlen(e), &n);
  T_CHECK(n == 256 && memcmp(d, all, 256) == 0);
  free(e);
  free(d);
  T_CHECK(newt_base64_decode_alloc("Zm9v!", 5, &n) == NULL);
  T_CHECK(newt_base64_decode_alloc("Z", 1, &n) == NULL);
}

static void test_parse(void) {
  int64_t v;
  T_CHECK(newt_parse_size("4096", &v) == 0 && v == 4096);
  T_CHECK(newt_parse_size("64K", &v) == 0 && v == 65536);
  T_CHECK(newt_parse_size("1G", &v) == 0 && v == 1073741824);
  T_CHECK(newt_parse_size("2MiB", &v) == 0 && v == 2097152);
  T_CHECK(newt_parse_size("12x", &v) != 0);
  T_CHECK(newt_parse_size("", &v) != 0);
  T_CHECK(newt_parse_int("-17", &v) == 0 && v == -17);
  T_CHECK(newt_parse_int("17a", &v) != 0);
  char hex[9];
  unsigned char raw[4] = {0xde, 0xad, 0xbe, 0xef}, back[4];
  newt_hex_encode(raw, 4, hex);
  T_CHECK(strcmp(hex, "deadbeef") == 0);
  T_CHECK(newt_hex_decode(hex, back, 4) == 0 && memcmp(raw, back, 4) == 0);
  T_CHECK(newt_hex_decode("zz", back, 1) != 0);
}

static void test_json(void) {
  const char *text = "{\"tp\":2,\"rev\":\"123456789012\",\"name\":\"x\",\"f\":1.5,\"b\":true,\"bad\":\"two\"}";
  cJSON *j = NULL;
  T_OK(newt_json_parse(text, strlen(text), "spec", &j));
  int64_t tp = 0, rev = 0, missing = 7;
  T_OK(newt_json_get_int(j, "spec", "tp", 1, &tp));
  T_CHECK(tp == 2);
  T_OK(newt_json_get_int(j, "spec", "rev", 1, &rev));
  T_CHECK(rev == 123456789012LL);
  T_OK(newt_json_get_int(j, "spec", "nope", 0, &missing));
  T_CHECK(missing == 7);
  T_ERR(NEWT_ERR_INVALID, newt_json_get_int(j, "spec", "nope", 1, &missing));
  T_CHECK(strstr(newt_errmsg(), "spec.nope") != NULL);
  T_ERR(NEWT_ERR_INVALID, newt_json_get_int(j, "spec", "bad", 1, &missing));
  T_CHECK(strstr(newt_errmsg(), "spec.bad") && strstr(newt_errmsg(), "two"));
  T_ERR(NEWT_ERR_INVALID, newt_json_get_int(j, "spec", "f", 1, &missing));
  const char *known[] = {"tp", "rev", "name", "f", "b", NULL};
  T_ERR(NEWT_ERR_INVALID, newt_json_check_fields(j, "spec", known));
  T_CHECK(strstr(newt_errmsg(), "spec.bad: unknown field") != NULL);
  cJSON_Delete(j);
  /* one integer encoding both ways: beyond 2^53 a string, read back exactly */
  cJSON *o = cJSON_CreateObject();
  int64_t vals[] = {0, -5, NEWT_JSON_INT_EXACT, NEWT_JSON_INT_EXACT + 1, INT64_MAX, INT64_MIN + 1};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    char f[8];
    snprintf(f, sizeof f, "v%zu", i);
    newt_json_add_int(o, f, vals[i]);
  }
  char *printed = newt_json_print(o);
  cJSON_Delete(o);
  T_OK(newt_json_parse(printed, strlen(printed), "ints", &o));
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    char f[8];
    int64_t back = 0;
    snprintf(f, sizeof f, "v%zu", i);
    T_OK(newt_json_get_int(o, "ints", f, 1, &back));
    T_CHECK_MSG(back == vals[i], "%s: wrote %lld, read %lld (%s)", f, (long long)vals[i], (long long)back, printed);
  }
  cJSON_Delete(o);
  free(printed);
  T_ERR(NEWT_ERR_INVALID, newt_json_parse("{\"a\":", 5, "plan", &j));
  T_CHECK(strstr(newt_errmsg(), "plan: malformed JSON") != NULL);
}

static void test_fs(void) {
  char dir[] = "/tmp/newt-test-fs-XXXXXX";
  T_CHECK(mkdtemp(dir) != NULL);
  char path[256];
  snprintf(path, sizeof path, "%s/a/b/c", dir);
  T_OK(newt_fs_mkdirs(path, 0755));
  T_CHECK(newt_fs_exists(path));
  snprintf(path, sizeof path, "%s/a/file", dir);
  T_OK(newt_fs_write_atomic(path, "hello", 5));
  char *buf = NULL;
  size_t n = 0;
  T_OK(newt_fs_read_all(path, 100, &buf, &n));
  T_CHECK(n == 5 && strcmp(buf, "hello") == 0);
  free(buf);
  T_ERR(NEWT_ERR_INVALID, newt_fs_read_all(path, 3, &buf, &n));
  T_ERR(NEWT_ERR_NOTFOUND, newt_fs_read_all("/nonexistent/newt", 3, &buf, &n));
  T_OK(newt_fs_rm_rf(dir));
  T_CHECK(!newt_fs_exists(dir));
  T_OK(newt_fs_rm_rf(dir));
}

/* The _at functions with links and FIFOs planted under the names they use. */
static void test_fs_at(void) {
  char dir[] = "/tmp/newt-test-fsat-XXXXXX", p[256], victim[256], vdir[256];
  T_CHECK(mkdtemp(dir) != NULL);
  snprintf(victim, sizeof victim, "%s/victim", dir);
  snprintf(vdir, sizeof vdir, "%s/vdir", dir);
  T_OK(newt_fs_write_atomic(victim, "victim", 6));
  T_OK(newt_fs_mkdirs(vdir, 0755));
  snprintf(p, sizeof p, "%s/vdir/keep", dir);
  T_OK(newt_fs_write_atomic(p, "keep", 4));
  snprintf(p, sizeof p, "%s/in", dir);
  int fd, sub;
  T_OK(newt_fs_dir_open(p, 1, &fd));
  /* a link under the temporary name, and under the name itself: neither is written through */
  snprintf(p, sizeof p, "%s/in/f.tmp.%d", dir, (int)getpid());
  T_CHECK(symlink(victim, p) == 0);
  snprintf(p, sizeof p, "%s/in/g", dir);
  T_CHECK(symlink(victim, p) == 0);
  T_OK(newt_fs_write_atomic_at(fd, "in", "f", "new", 3));
  int w;
  T_OK(newt_fs_create_at(fd, "in", "g", 0, &w));
  T_CHECK(write(w, "x", 1) == 1);
  close(w);
  char *buf = NULL;
  size_t n = 0;
  T_OK(newt_fs_read_all(victim, 100, &buf, &n));
  T_CHECK(n == 6 && strcmp(buf, "victim") == 0);
  free(buf);
  T_OK(newt_fs_read_all_at(fd, "in", "f", 100, &buf, &n));
  T_CHECK(n == 3 && strcmp(buf, "new") == 0);
  free(buf);
  /* reads: a link, a FIFO and a directory are refused by name, at once */
  snprintf(p, sizeof p, "%s/in/link", dir);
  T_CHECK(symlink(victim, p) == 0);
  T_ERR(NEWT_ERR_INVALID, newt_fs_read_all_at(fd, "in", "link", 100, &buf, &n));
  T_CHECK(strstr(newt_errmsg(), "in/link is a symbolic link") != NULL);
  snprintf(p, sizeof p, "%s/in/fifo", dir);
  T_CHECK(mkfifo(p, 0644) == 0);
  T_ERR(NEWT_ERR_INVALID, newt_fs_read_all_at(fd, "in", "fifo", 100, &buf, &n));
  T_CHECK(strstr(newt_errmsg(), "in/fifo is a FIFO, not a regular file") != NULL);
  T_ERR(NEWT_ERR_NOTFOUND, newt_fs_read_all_at(fd, "in", "none", 100, &buf, &n));
  T_ERR(NEWT_ERR_INVALID, newt_fs_read_all_at(fd, "in", "f", 2, &buf, &n));
  /* a directory that is a link: refused to readers, replaced by a writer */
  snprintf(p, sizeof p, "%s/in/d", dir);
  T_CHECK(symlink(vdir, p) == 0);
  T_ERR(NEWT_ERR_INVALID, newt_fs_subdir_at(fd, "in", "d", 0, &sub));
  T_OK(newt_fs_subdir_at(fd, "in", "d", 1, &sub));
  close(sub);
  struct stat st;
  T_CHECK(lstat(p, &st) == 0 && S_ISDIR(st.st_mode));
  T_CHECK(newt_fs_exists_at(fd, "d") && !newt_fs_exists_at(fd, "none"));
  /* removal unlinks links, never what they point to */
  snprintf(p, sizeof p, "%s/in/d/up", dir);
  T_CHECK(symlink(vdir, p) == 0);
  close(fd);
  snprintf(p, sizeof p, "%s/in", dir);
  T_OK(newt_fs_rm_rf(p));
  T_CHECK(!newt_fs_exists(p));
  snprintf(p, sizeof p, "%s/vdir/keep", dir);
  T_CHECK(newt_fs_exists(p) && newt_fs_exists(victim));
  T_OK(newt_fs_rm_rf(dir));
}

static void test_opts(void) {
  int64_t n = 4, sz = 0;
  double lr = 0.1;
  const char *name = "def";
  int flag = 0;
  newt_opt opts[] = {{"n", NEWT_OPT_INT, &n, "count"},
                     {"size", NEWT_OPT_SIZE, &sz, "bytes"},
                     {"lr", NEWT_OPT_DOUBLE, &lr, "rate"},
                     {"name", NEWT_OPT_STR, &name, "name"},
                     {"flag", NEWT_OPT_FLAG, &flag, "on"},
                     NEWT_OPT_END};
  char *argv[] = {"--n", "8", "--size=64M", "pos1", "--lr", "0.5", "--flag", "--name=x"};
  char *pos[2];
  int npos = 0;
  T_OK(newt_opts_parse("t", NULL, opts, 8, argv, pos, 2, &npos));
  T_CHECK(n == 8 && sz == 64 << 20 && lr == 0.5 && flag == 1 && strcmp(name, "x") == 0);
  T_CHECK(npos == 1 && strcmp(pos[0], "pos1") == 0);
  char *bad1[] = {"--nope"};
  T_ERR(NEWT_ERR_INVALID, newt_opts_parse("t", NULL, opts, 1, bad1, pos, 2, &npos));
  T_CHECK(strstr(newt_errmsg(), "--nope") != NULL);
  char *bad2[] = {"--n", "eight"};
  T_ERR(NEWT_ERR_INVALID, newt_opts_parse("t", NULL, opts, 2, bad2, pos, 2, &npos));
  T_CHECK(strstr(newt_errmsg(), "--n expects an integer") != NULL);
  char *bad3[] = {"--n"};
  T_ERR(NEWT_ERR_INVALID, newt_opts_parse("t", NULL, opts, 1, bad3, pos, 2, &npos));
  /* a near miss names the flag that was meant; a far one does not guess */
  char *typo[] = {"--szie", "1"};
  T_ERR(NEWT_ERR_INVALID, newt_opts_parse("t", NULL, opts, 2, typo, pos, 2, &npos));
  T_CHECK_MSG(strstr(newt_errmsg(), "unknown flag --szie: did you mean --size?") != NULL, "%s", newt_errmsg());
  T_ERR(NEWT_ERR_INVALID, newt_opts_parse("t", NULL, opts, 1, bad1, pos, 2, &npos));
  T_CHECK(strstr(newt_errmsg(), "did you mean") == NULL);
}

/* `newt worker [flags] -- COMMAND [ARGS...]`: the flags before the first `--`, the words after
 * it left alone (flags of the program, a second `--`, --help), and no positional argument. */
static void test_opts_command(void) {
  int64_t n = 4;
  const char *name = NULL;
  newt_opt opts[] = {{"n", NEWT_OPT_INT, &n, "count"}, {"name", NEWT_OPT_STR, &name, "name"}, NEWT_OPT_END};
  char *argv[] = {"--n", "8", "--", "prog", "--n", "9", "--", "--help"};
  int cmd = 0;
  T_OK(newt_opts_parse_command("t", NULL, NULL, opts, 8, argv, &cmd));
  T_CHECK_MSG(n == 8 && cmd == 3, "n %lld, command at %d", (long long)n, cmd);
  char *value[] = {"--name", "--", "--", "prog"}; /* a flag's value is not the end of the flags */
  T_OK(newt_opts_parse_command("t", NULL, NULL, opts, 4, value, &cmd));
  T_CHECK_MSG(name && strcmp(name, "--") == 0 && cmd == 3, "name %s, command at %d", name ? name : "(null)", cmd);
  char *none[] = {"--n", "1"};
  T_OK(newt_opts_parse_command("t", NULL, NULL, opts, 2, none, &cmd));
  T_CHECK(cmd == -1);
  char *empty[] = {"--n", "1", "--"};
  T_OK(newt_opts_parse_command("t", NULL, NULL, opts, 3, empty, &cmd));
  T_CHECK(cmd == 3);
  char *stray[] = {"prog", "--", "x"};
  T_ERR(NEWT_ERR_INVALID, newt_opts_parse_command("t", NULL, NULL, opts, 3, stray, &cmd));
  T_CHECK_MSG(strstr(newt_errmsg(), "unexpected argument \"prog\""), "%s", newt_errmsg());
}

static void test_closest_name(void) {
  const char *names[] = {"nproc", "steps", "global-batch", "micro-batch", "status", "run", NULL};
  const struct {
    const char *word, *want;
  } cases[] = {{"nprc", "nproc"},         {"nprocs", "nproc"}, {"npocr", "nproc"},   {"stpes", "steps"},
               {"global-bacth", "global-batch"}, {"micro", "micro-batch"}, {"rnu", "run"},
               {"statsu", "status"},       {"xyz", NULL},       {"", NULL},         {"checkpoint", NULL}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *got = newt_closest_name(cases[i].word, strlen(cases[i].word), names);
    T_CHECK_MSG((got == NULL && cases[i].want == NULL) || (got && cases[i].want && strcmp(got, cases[i].want) == 0),
                "closest(%s) = %s, want %s", cases[i].word, got ? got : "none", cases[i].want ? cases[i].want : "none");
  }
}

static void test_proc(void) {
  const char *ok[] = {"sh", "-c", "exit 3", NULL};
  pid_t pid;
  int st = 0;
  T_OK(newt_proc_spawn(ok, NULL, &pid));
  T_OK(newt_proc_wait(pid, 5000, &st));
  T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 3);
  const char *missing[] = {"/nonexistent/newt-binary", NULL};
  T_ERR(NEWT_ERR_NOTFOUND, newt_proc_spawn(missing, NULL, &pid));
  const char *sleeper[] = {"sleep", "30", NULL};
  T_OK(newt_proc_spawn(sleeper, NULL, &pid));
  T_CHECK(newt_proc_alive(pid));
  T_ERR(NEWT_ERR_TIMEOUT, newt_proc_wait(pid, 50, &st));
  kill(pid, SIGSTOP);
  double t0 = newt_now_s();
  T_OK(newt_proc_stop(pid, 2000)); /* stopped processes still get stopped */
  T_CHECK(newt_now_s() - t0 < 5);
  T_CHECK(!newt_proc_alive(pid));
}

static void test_fmt_duration(void) {
  const struct {
    double s;
    const char *want;
  } cases[] = {{-1, "0 ms"},        {0.3344, "334 ms"},     {1.25, "1.2 s"},         {9.99, "10 s"},
               {38.4, "38 s"},      {59.6, "1 min 00 s"},   {245, "4 min 05 s"},     {7380, "2 h 03 min"}};
  char buf[32];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    T_CHECK_MSG(strcmp(newt_fmt_duration(cases[i].s, buf, sizeof buf), cases[i].want) == 0, "%g s: \"%s\", want \"%s\"",
                cases[i].s, buf, cases[i].want);
}

static void test_clock(void) {
  newt_deadline_t d = newt_deadline_in_ms(30);
  T_CHECK(!newt_deadline_passed(d));
  T_CHECK(newt_deadline_left_ms(d) <= 30);
  newt_sleep_ms(40);
  T_CHECK(newt_deadline_passed(d));
  T_CHECK(newt_deadline_left_ms(d) == 0);
  T_CHECK(!newt_deadline_passed(NEWT_DEADLINE_NONE));
  T_CHECK(newt_deadline_in_ms(-1) == NEWT_DEADLINE_NONE);
  int port = 0;
  T_OK(newt_net_free_port(&port));
  T_CHECK(port > 0 && port < 65536);
  char hex[33];
  T_OK(newt_random_hex(hex, 16));
  T_CHECK(strlen(hex) == 32);
}

/* A log line in the given NEWT_LOG_FORMAT, written by a child (the configuration is read
 * once per process) into a file; returns it (malloc'd). */
static char *log_line(const char *format, const char *msg) {
  char path[] = "/tmp/newt-log-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  close(fd);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("NEWT_LOG_FORMAT", format, 1);
    setenv("NEWT_DEBUG_FILE", path, 1);
    unsetenv("NEWT_DEBUG");
    newt_log_set_name("worker-3");
    newt_log_set_default_level(NEWT_LOG_INFO);
    NEWT_INFO(WORKER, "%s", msg);
    NEWT_DEBUG(WORKER, "not shown at INFO");
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  char *text = NULL;
  size_t len = 0;
  newt_fs_read_all(path, 1 << 16, &text, &len);
  unlink(path);
  return text;
}

static void test_log_format(void) {
  char *t = log_line("text", "plan 2 (crash)");
  int y, mo, d, h, mi, sec, ms;
  T_CHECK_MSG(t && sscanf(t, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ ", &y, &mo, &d, &h, &mi, &sec, &ms) == 7 &&
                  strstr(t, " worker-3[") && strstr(t, "] INFO WORKER test_common.c:") && strstr(t, "plan 2 (crash)\n") &&
                  !strstr(t, "not shown"),
              "text line: %s", t ? t : "(none)");
  free(t);
  t = log_line("json", "a \"quoted\" word\tand a tab");
  cJSON *j = t ? cJSON_Parse(t) : NULL;
  T_CHECK_MSG(j, "not one JSON object: %s", t ? t : "(none)");
  if (j) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "msg"), *lvl = cJSON_GetObjectItemCaseSensitive(j, "level");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "time"), *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    T_CHECK(cJSON_IsString(m) && strcmp(m->valuestring, "a \"quoted\" word\tand a tab") == 0);
    T_CHECK(cJSON_IsString(lvl) && strcmp(lvl->valuestring, "INFO") == 0);
    T_CHECK(cJSON_IsString(name) && strcmp(name->valuestring, "worker-3") == 0);
    T_CHECK(cJSON_IsString(tm) && strlen(tm->valuestring) == 24 && tm->valuestring[23] == 'Z');
    cJSON_Delete(j);
  }
  free(t);
}

int main(void) {
  T_RUN(test_log_format);
  T_RUN(test_errmsg);
  T_RUN(test_base64);
  T_RUN(test_parse);
  T_RUN(test_json);
  T_RUN(test_fs);
  T_RUN(test_fs_at);
  T_RUN(test_opts);
  T_RUN(test_opts_command);
  T_RUN(test_closest_name);
  T_RUN(test_proc);
  T_RUN(test_clock);
  T_RUN(test_fmt_duration);
  return T_DONE();
}
