/* work PAGES SPIN_MS [CALLS [wait]]: optionally wait for a byte on stdin
 * (until the parent has opened its counters on this process), call solve()
 * CALLS times, each followed by a write(2) to a bad descriptor (counted by
 * the syscall tracepoints, nothing printed), touch PAGES fresh pages (one
 * fault each), then burn SPIN_MS of CPU time. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) long solve(long i) {
    __asm__ volatile("");
    return i * 3 + 1;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    long pages = atol(argv[1]), ms = atol(argv[2]), calls = argc > 3 ? atol(argv[3]) : 0, s = 0;
    if (argc > 4 && strcmp(argv[4], "wait") == 0) {
        char c;
        if (read(0, &c, 1) < 0) return 3;
    }
    for (long i = 0; i < calls; i++) {
        s += solve(i);
        if (write(-1, "", 0) != -1) return 5;
    }
    char *p = mmap(0, pages * 4096 + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 4;
    madvise(p, pages * 4096 + 4096, MADV_NOHUGEPAGE); /* one fault per 4 KiB page */
    for (long i = 0; i < pages; i++) p[i * 4096] = 1;
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    volatile unsigned long x = s;
    do {
        for (int i = 0; i < 100000; i++) x += i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
    return 0;
}
