/* papi_command_line: count the named events over a known workload. */
#include <math.h>
#include "tool.h"

static volatile double sink;

/* PAPI's tool runs 'flops' and 'misses' loops; this is a floating-point
   loop over an array bigger than the caches. */
static void workload(void) {
    size_t n = 4 << 20;
    double *a = malloc(n * sizeof *a);
    for (size_t i = 0; i < n; i++) a[i] = (double)i;
    double s = 0;
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < n; i += 7) s += sqrt(a[i]) * 1.0001;
    sink = s;
    free(a);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        printf("Usage: papi_command_line EVENT [EVENT...]\n"
               "  Adds each event (a PAPI preset or a native name such as perf::TASK-CLOCK),\n"
               "  runs a floating-point workload and prints each count.\n");
        return argc < 2 ? 1 : 0;
    }
    init();
    int es = PAPI_NULL, r, n = 0;
    char *names[64];
    if ((r = PAPI_create_eventset(&es)) != PAPI_OK) die("PAPI_create_eventset", r);
    for (int i = 1; i < argc && n < 64; i++) {
        if ((r = PAPI_add_named_event(es, argv[i])) == PAPI_OK) {
            printf("Successfully added: %s\n", argv[i]);
            names[n++] = argv[i];
        } else {
            printf("Failed adding: %s\nbecause: %s\n", argv[i], PAPI_strerror(r));
        }
    }
    if (n == 0) { printf("No events added!\n"); return 1; }
    long long values[64];
    if ((r = PAPI_start(es)) != PAPI_OK) die("PAPI_start", r);
    workload();
    if ((r = PAPI_stop(es, values)) != PAPI_OK) die("PAPI_stop", r);
    printf("\n----------------------------------\n");
    for (int i = 0; i < n; i++) {
        int code;
        PAPI_event_info_t info;
        PAPI_event_name_to_code(names[i], &code);
        PAPI_get_event_info(code, &info);
        printf("%s : \t%lld %s\n", names[i], values[i], info.units);
    }
    printf("----------------------------------\n");
    printf("Verification: Checks for valid event name.\n This utility lets you add events from the command line interface to see if they work.\n");
    return 0;
}
