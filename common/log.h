/* Logging with levels and subsystems, in the manner of NCCL_DEBUG / NCCL_DEBUG_SUBSYS.
 *
 *   NEWT_DEBUG=ERROR|WARN|INFO|DEBUG|TRACE   (default WARN; INFO for the coordinator and
 *                                            the worker, whose lifecycle lines are INFO)
 *   NEWT_DEBUG_SUBSYS=RDZV,COMM,...          (default ALL; ^RDZV excludes)
 *   NEWT_DEBUG_FILE=path                     (default stderr; %p becomes the pid)
 *   NEWT_LOG_FORMAT=text|json                (default text)
 *
 * A text line reads "2026-12-01T10:15:30.123Z <name>[pid] LEVEL SUBSYS file:line message"
 * (ISO 8601, UTC, milliseconds). A JSON line is one object for log pipelines:
 *   {"time":"2026-12-01T10:15:30.123Z","level":"INFO","subsys":"COORD","name":"coordinator-0",
 *    "pid":1,"src":"coordinator.c:512","msg":"published plan 2 (crash): ..."}
 * The name is the process's role ("worker-3", "coordinator-0"), set once with
 * newt_log_set_name. */
#ifndef NEWT_COMMON_LOG_H
#define NEWT_COMMON_LOG_H

typedef enum newt_log_level {
  NEWT_LOG_NONE = 0,
  NEWT_LOG_ERROR,
  NEWT_LOG_WARN,
  NEWT_LOG_INFO,
  NEWT_LOG_DEBUG,
  NEWT_LOG_TRACE,
} newt_log_level;

enum newt_subsys {
  NEWT_SUBSYS_COMMON = 1 << 0,
  NEWT_SUBSYS_RDZV = 1 << 1,
  NEWT_SUBSYS_COMM = 1 << 2,
  NEWT_SUBSYS_MODEL = 1 << 3,
  NEWT_SUBSYS_CKPT = 1 << 4,
  NEWT_SUBSYS_COORD = 1 << 5,
  NEWT_SUBSYS_WORKER = 1 << 6,
  NEWT_SUBSYS_CLI = 1 << 7,
  NEWT_SUBSYS_BENCH = 1 << 8,
  NEWT_SUBSYS_JOB = 1 << 9,
  NEWT_SUBSYS_ALL = ~0,
};

/* Current threshold; a line is written when level <= threshold and the subsystem is on. */
int newt_log_enabled(newt_log_level level, int subsys);

void newt_log(newt_log_level level, int subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Role name shown on every line of this process (copied). */
void newt_log_set_name(const char *name);

/* Overrides NEWT_DEBUG for this process (tests, --verbose). */
void newt_log_set_level(newt_log_level level);
/* The level of this process when NEWT_DEBUG does not say (services: INFO). */
void newt_log_set_default_level(newt_log_level level);

#define NEWT_LOG_AT(level, sub, ...)                                          \
  do {                                                                        \
    if (newt_log_enabled((level), NEWT_SUBSYS_##sub))                         \
      newt_log((level), NEWT_SUBSYS_##sub, __FILE__, __LINE__, __VA_ARGS__);  \
  } while (0)

#define NEWT_ERROR(sub, ...) NEWT_LOG_AT(NEWT_LOG_ERROR, sub, __VA_ARGS__)
#define NEWT_WARN(sub, ...) NEWT_LOG_AT(NEWT_LOG_WARN, sub, __VA_ARGS__)
#define NEWT_INFO(sub, ...) NEWT_LOG_AT(NEWT_LOG_INFO, sub, __VA_ARGS__)
#define NEWT_DEBUG(sub, ...) NEWT_LOG_AT(NEWT_LOG_DEBUG, sub, __VA_ARGS__)
#define NEWT_TRACE(sub, ...) NEWT_LOG_AT(NEWT_LOG_TRACE, sub, __VA_ARGS__)

#endif
