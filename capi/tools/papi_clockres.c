/* papi_clockres: latency and resolution of PAPI's timers, as PAPI's tool
   measures them: back-to-back readings and their differences. */
#include "tool.h"

#define N 1000000
static long long d[N];

static void clockres(const char *name, long long (*f)(void)) {
    long long prev = f(), total = 0, lo = -1, hi = 0;
    long nonzero = 0;
    for (long i = 0; i < N; i++) {
        long long now = f();
        d[i] = now - prev;
        prev = now;
    }
    for (long i = 0; i < N; i++) {
        if (d[i] < 0) { printf("%s went backwards by %lld\n", name, -d[i]); exit(1); }
        total += d[i];
        nonzero += d[i] != 0;
        if (lo < 0 || d[i] < lo) lo = d[i];
        if (d[i] > hi) hi = d[i];
    }
    printf("%s: min %lld  max %lld  average %.3f\n", name, lo, hi, (double)total / N);
    printf("%s : %8.3f   %c %8.3f\n", name, (double)total / N, nonzero == N ? '<' : (nonzero == 0 ? '>' : ' '),
           nonzero ? (double)total / (double)nonzero : 0.0);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        printf("Usage: papi_clockres\n  Latency (per call) and resolution of PAPI_get_real_cyc/usec/nsec and\n  PAPI_get_virt_cyc/usec/nsec over %d back-to-back calls.\n", N);
        return strcmp(argv[1], "-h") && strcmp(argv[1], "--help") ? 1 : 0;
    }
    init();
    printf("Printing Clock latency and resolution.\n-----------------------------------------------\n");
    clockres("PAPI_get_real_cyc", PAPI_get_real_cyc);
    clockres("PAPI_get_real_usec", PAPI_get_real_usec);
    clockres("PAPI_get_real_nsec", PAPI_get_real_nsec);
    clockres("PAPI_get_virt_cyc", PAPI_get_virt_cyc);
    clockres("PAPI_get_virt_usec", PAPI_get_virt_usec);
    clockres("PAPI_get_virt_nsec", PAPI_get_virt_nsec);
    return 0;
}
