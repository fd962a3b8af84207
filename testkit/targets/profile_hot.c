/* A CPU-bound target with known hot functions: each round calls hot_a,
   hot_b and hot_c, which do 60, 30 and 10 % of its work (the same loop,
   6, 3 and 1 units long).

   profile_hot ROUNDS [THREADS [TIMEFILE]]: THREADS threads (default 1,
   the main thread) each run ROUNDS rounds (0: until killed); extra
   threads are named worker-N. Prints "ready" once every thread runs,
   writes the wall time of the work in ns to TIMEFILE if given, exits 3.

   Built -O0 with frame pointers: gcc 12 gives a leaf function that does
   not touch the stack no frame even with -fno-omit-frame-pointer, and the
   frame-pointer walk then skips its caller. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "papirus_target.h"

static long rounds;

/* spin() is inlined, so each hot function is the leaf of its own samples. */
void hot_a(void) { spin(6); }
void hot_b(void) { spin(3); }
void hot_c(void) { spin(1); }

static void *run(void *arg) {
    (void)arg;
    for (long r = 0; rounds == 0 || r < rounds; r++) { hot_a(); hot_b(); hot_c(); }
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 100;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t t[64];
    for (int i = 1; i < threads && i < 64; i++) {
        char name[16];
        pthread_create(&t[i], NULL, run, NULL);
        snprintf(name, sizeof name, "worker-%d", i);
        pthread_setname_np(t[i], name);
    }
    printf("ready\n");
    fflush(stdout);
    run(NULL);
    for (int i = 1; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (argc > 3) {
        FILE *f = fopen(argv[3], "w");
        if (!f) return 4;
        fprintf(f, "%lld\n", (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
        fclose(f);
    }
    return 3;
}
