/* papi_cost: what PAPI calls cost here, in TSC cycles (min, max, mean,
   standard deviation), as PAPI's tool reports them. PAPI's tool needs
   PAPI_TOT_CYC and PAPI_TOT_INS; without a PMU this one counts
   perf::TASK-CLOCK and perf::PAGE-FAULTS instead, and says so. */
#include <math.h>
#include "tool.h"

static long long *t;

static void report(const char *what, long n) {
    long long lo = t[0], hi = t[0];
    double sum = 0, sq = 0;
    for (long i = 0; i < n; i++) {
        if (t[i] < lo) lo = t[i];
        if (t[i] > hi) hi = t[i];
        sum += (double)t[i];
    }
    double mean = sum / (double)n;
    for (long i = 0; i < n; i++) sq += ((double)t[i] - mean) * ((double)t[i] - mean);
    printf("\nTotal cost for %s over %ld iterations\n", what, n);
    printf("min cycles   : %lld\nmax cycles   : %lld\nmean cycles  : %f\nstd deviation: %f\n", lo, hi, mean,
           n > 1 ? sqrt(sq / (double)(n - 1)) : 0.0);
}

/* Times `call` n times, each between two PAPI_get_real_cyc, then reports.
   A macro, so the timed call is the call itself, not one through a pointer. */
#define TIME(what, call)                                 \
    do {                                                 \
        for (long i = 0; i < n; i++) {                   \
            long long a = PAPI_get_real_cyc();           \
            (void)(call);                                \
            t[i] = PAPI_get_real_cyc() - a;              \
        }                                                \
        report(what, n);                                 \
    } while (0)

int main(int argc, char **argv) {
    long n = 100000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) n = atol(argv[++i]);
        else {
            printf("Usage: papi_cost [-t ITERATIONS]\n  Times PAPI_start/stop, PAPI_read, PAPI_read_ts, PAPI_accum and PAPI_reset\n  with PAPI_get_real_cyc (default 100000 iterations).\n");
            return strcmp(argv[i], "-h") && strcmp(argv[i], "--help") ? 1 : 0;
        }
    }
    if (n < 2) n = 2;
    init();
    t = malloc(sizeof *t * (size_t)n);
    const char *ev[2] = {"PAPI_TOT_CYC", "PAPI_TOT_INS"};
    if (PAPI_query_event(PAPI_TOT_CYC) != PAPI_OK || PAPI_query_event(PAPI_TOT_INS) != PAPI_OK) {
        printf("PAPI_TOT_CYC and PAPI_TOT_INS cannot be counted here (no hardware PMU):\n"
               "timing with perf::TASK-CLOCK and perf::PAGE-FAULTS instead.\n");
        ev[0] = "perf::TASK-CLOCK";
        ev[1] = "perf::PAGE-FAULTS";
    }
    int es = PAPI_NULL, r;
    long long v[2] = {0, 0}, cyc;
    PAPI_create_eventset(&es);
    for (int i = 0; i < 2; i++)
        if ((r = PAPI_add_named_event(es, ev[i])) != PAPI_OK) die(ev[i], r);
    printf("Cost of execution for PAPI start/stop, read and accum.\nThis test takes a while. Please be patient...\n");
    for (long i = 0; i < n; i++) t[i] = PAPI_get_real_cyc() - PAPI_get_real_cyc();
    for (long i = 0; i < n; i++) t[i] = -t[i];
    report("loop latency (PAPI_get_real_cyc)", n);
    TIME("PAPI_start/stop (2 counters)", (PAPI_start(es), PAPI_stop(es, v)));
    PAPI_start(es);
    TIME("PAPI_read (2 counters)", PAPI_read(es, v));
    TIME("PAPI_read_ts (2 counters)", PAPI_read_ts(es, v, &cyc));
    TIME("PAPI_accum (2 counters)", PAPI_accum(es, v));
    TIME("PAPI_reset (2 counters)", PAPI_reset(es));
    PAPI_stop(es, v);
    return 0;
}
