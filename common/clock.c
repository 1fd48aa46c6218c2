/* Monotonic clocks, deadlines and sleeps (see clock.h). */
#include "clock.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>

uint64_t newt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double newt_now_s(void) { return (double)newt_now_ns() * 1e-9; }

uint64_t newt_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

newt_deadline_t newt_deadline_in_ms(int64_t ms) {
  if (ms < 0) return NEWT_DEADLINE_NONE;
  return newt_now_ns() + (uint64_t)ms * 1000000ull;
}

int newt_deadline_passed(newt_deadline_t d) {
  return d != NEWT_DEADLINE_NONE && newt_now_ns() >= d;
}

int64_t newt_deadline_left_ms(newt_deadline_t d) {
  if (d == NEWT_DEADLINE_NONE) return INT64_MAX;
  uint64_t now = newt_now_ns();
  return now >= d ? 0 : (int64_t)((d - now + 999999ull) / 1000000ull);
}

newt_deadline_t newt_deadline_min(newt_deadline_t a, newt_deadline_t b) { return a < b ? a : b; }

char *newt_fmt_duration(double seconds, char *out, size_t cap) {
  double s = seconds > 0 ? seconds : 0;
  long r = (long)(s + 0.5); /* whole seconds */
  if (s < 0.9995) snprintf(out, cap, "%.0f ms", s * 1e3);
  else if (s < 9.95) snprintf(out, cap, "%.1f s", s);
  else if (r < 60) snprintf(out, cap, "%ld s", r);
  else if (r < 3600) snprintf(out, cap, "%ld min %02ld s", r / 60, r % 60);
  else snprintf(out, cap, "%ld h %02ld min", r / 3600, (r / 60) % 60);
  return out;
}

char *newt_fmt_utc(uint64_t wall_ms, char *out, size_t cap) {
  time_t t = (time_t)(wall_ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
           tm.tm_min, tm.tm_sec, (int)(wall_ms % 1000));
  return out;
}

static void sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void newt_sleep_ms(int64_t ms) {
  if (ms > 0) sleep_ns((uint64_t)ms * 1000000ull);
}

void newt_sleep_us(int64_t us) {
  if (us > 0) sleep_ns((uint64_t)us * 1000ull);
}
