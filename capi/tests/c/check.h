/* What papirus' C tests share: CHECK counts failures with the line and
   the values; KV prints a result the Rust side compares between libraries. */
#ifndef PAPIRUS_CHECK_H
#define PAPIRUS_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <papi.h>

static int failures __attribute__((unused));

#define CHECK(cond) do { if (!(cond)) { failures++; \
    fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_RC(call, want) do { int rc_ = (call); if (rc_ != (want)) { failures++; \
    fprintf(stderr, "%s:%d: %s returned %d, want %d\n", __FILE__, __LINE__, #call, rc_, (want)); } } while (0)
#define KV(key, fmt, ...) printf("kv %s " fmt "\n", key, __VA_ARGS__)

/* Which libpapi this process runs on (the test harness checks it). */
static inline void print_library(void) {
    char line[4096];
    FILE *f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *s = strstr(line, "/");
        if (s && strstr(s, "libpapi")) { printf("library %s", s); break; }
    }
    if (f) fclose(f);
}

static inline void init_or_die(void) {
    print_library();
    int r = PAPI_library_init(PAPI_VER_CURRENT);
    if (r != PAPI_VER_CURRENT) { fprintf(stderr, "PAPI_library_init: %d\n", r); exit(2); }
}

/* Spins for `ms` milliseconds of this thread's CPU time. */
static volatile double sink __attribute__((unused));
static inline void spin_ms(int ms) {
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    do {
        for (int i = 0; i < 10000; i++) sink += i * 0.5;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    } while ((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < ms);
}

/* Touches `pages` fresh pages: that many minor page faults (mmap, since
   malloc may hand back memory already touched). */
static inline void touch_pages(int pages) {
    size_t len = (size_t)pages * 4096;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(2); }
    for (int i = 0; i < pages; i++) p[(size_t)i * 4096] = 1;
    munmap(p, len);
}


static inline int finish(const char *name) {
    if (failures) { fprintf(stderr, "%s: %d failures\n", name, failures); return 1; }
    printf("%s: ok\n", name);
    return 0;
}
#endif
