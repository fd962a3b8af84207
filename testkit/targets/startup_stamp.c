/* Prints CLOCK_MONOTONIC at the start and at the end of main, so a bench
   can tell a tool's start-up (its start to this main) from its work after
   the program ends (this main's end to the tool's exit). It calls one
   function, so an instrumenting tool has something to patch. */
#include <stdio.h>
#include <time.h>

static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

__attribute__((noinline)) int step(int x) { return x * 2 + 1; }

int main(void) {
    long long start = now();
    int s = 0;
    for (int i = 0; i < 10; i++) s += step(i);
    fprintf(stderr, "STAMP %lld %lld %d\n", start, now(), s);
    return 0;
}
