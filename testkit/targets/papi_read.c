/* PAPI_read of the events named on the command line, through Debian's
   libpapi: prints the median nanoseconds per call over batches (the
   thread's CPU time, so time spent waiting for a CPU is not counted), for a
   bench that compares papirus' EventSet::read with it in the same run.
   Usage: papi_read BATCHES CALLS EVENT... */
#include <papi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int batches = atoi(argv[1]);
    long calls = atol(argv[2]);
    int n = argc - 3, set = PAPI_NULL;
    if (PAPI_library_init(PAPI_VER_CURRENT) != PAPI_VER_CURRENT || PAPI_create_eventset(&set) != PAPI_OK) {
        fprintf(stderr, "PAPI does not initialise\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        int r = PAPI_add_named_event(set, argv[3 + i]);
        if (r != PAPI_OK) {
            fprintf(stderr, "PAPI cannot add %s: %s\n", argv[3 + i], PAPI_strerror(r));
            return 1;
        }
    }
    long long v[16];
    double *ns = malloc(sizeof(double) * batches);
    if (!ns || n > 16 || PAPI_start(set) != PAPI_OK) return 1;
    for (long i = 0; i < calls; i++) PAPI_read(set, v);
    for (int b = 0; b < batches; b++) {
        double t = now_ns();
        for (long i = 0; i < calls; i++) PAPI_read(set, v);
        ns[b] = (now_ns() - t) / calls;
    }
    qsort(ns, batches, sizeof(double), cmp);
    printf("%.1f\n", ns[batches / 2]);
    return 0;
}
