/* Clocks and deadlines. Monotonic time for every wait and measurement; wall time only
 * for timestamps shown to people or stored in events. A deadline is an absolute
 * monotonic time in nanoseconds; NEWT_DEADLINE_NONE never passes. */
#ifndef NEWT_COMMON_CLOCK_H
#define NEWT_COMMON_CLOCK_H

#include <stddef.h>
#include <stdint.h>

typedef uint64_t newt_deadline_t;
#define NEWT_DEADLINE_NONE UINT64_MAX

uint64_t newt_now_ns(void);  /* monotonic */
double newt_now_s(void);     /* monotonic, seconds */
uint64_t newt_wall_ms(void); /* milliseconds since the epoch */

newt_deadline_t newt_deadline_in_ms(int64_t ms); /* now + ms; ms < 0 means none */
int newt_deadline_passed(newt_deadline_t d);
int64_t newt_deadline_left_ms(newt_deadline_t d); /* >= 0; INT64_MAX for none */
newt_deadline_t newt_deadline_min(newt_deadline_t a, newt_deadline_t b);

/* A duration for people: "850 ms", "4.2 s", "38 s", "4 min 05 s", "2 h 03 min"
 * (negative: "0 ms"). Returns out. */
char *newt_fmt_duration(double seconds, char *out, size_t cap);
/* A wall-clock time in ms as ISO 8601 UTC to the millisecond ("2026-12-01T10:15:30.123Z").
 * Returns out. */
char *newt_fmt_utc(uint64_t wall_ms, char *out, size_t cap);

void newt_sleep_ms(int64_t ms);
void newt_sleep_us(int64_t us);

#endif
