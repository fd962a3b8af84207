/* Overflow handlers on a software event: about one call per threshold. */
#include "check.h"

static volatile int calls, bad_set, bad_vector;
static int the_set;

static void handler(int es, void *address, long long vector, void *context) {
    (void)address; (void)context;
    calls++;
    if (es != the_set) bad_set++;
    if (vector != 1) bad_vector++;
}

int main(void) {
    init_or_die();
    int es = PAPI_NULL, code;
    long long v[1];
    PAPI_create_eventset(&es);
    the_set = es;
    PAPI_event_name_to_code("perf::TASK-CLOCK", &code);
    CHECK_RC(PAPI_overflow(es, code, 1000000, 0, handler), PAPI_ENOCMP);  /* not in an unbound set */
    CHECK_RC(PAPI_add_event(es, code), PAPI_OK);
    CHECK_RC(PAPI_overflow(es, PAPI_TOT_CYC, 1000000, 0, handler), PAPI_ENOEVNT);
    CHECK_RC(PAPI_overflow(es, code, -1, 0, handler), PAPI_EINVAL);
    CHECK_RC(PAPI_overflow(es, code, 1000000, 0, NULL), PAPI_EINVAL);
    CHECK_RC(PAPI_overflow(es, code, 0, 0, handler), PAPI_EINVAL);       /* not overflowing */
    CHECK_RC(PAPI_overflow(es, code, 2000000, 0, handler), PAPI_OK);    /* every 2 ms of CPU */
    int st = 0;
    PAPI_state(es, &st);
    CHECK(st & PAPI_OVERFLOWING);
    CHECK_RC(PAPI_start(es), PAPI_OK);
    CHECK_RC(PAPI_overflow(es, code, 0, 0, handler), PAPI_EISRUN);
    spin_ms(300);
    CHECK_RC(PAPI_stop(es, v), PAPI_OK);
    printf("overflow calls %d for %lld ns of task-clock\n", calls, v[0]);
    long long expect = v[0] / 2000000;
    CHECK(calls >= expect * 6 / 10 && calls <= expect + 5);
    CHECK(bad_set == 0 && bad_vector == 0);
    KV("overflow_calls_near_expected", "%d", calls >= expect * 6 / 10 && calls <= expect + 5);
    int idx[4], n = 4;
    CHECK_RC(PAPI_get_overflow_event_index(es, 1, idx, &n), PAPI_OK);
    CHECK(n == 1 && idx[0] == 0);
    CHECK_RC(PAPI_get_overflow_event_index(es, 0, idx, &n), PAPI_EINVAL);
    CHECK_RC(PAPI_overflow(es, code, 0, 0, handler), PAPI_OK);           /* off */
    int before = calls;
    CHECK_RC(PAPI_start(es), PAPI_OK);
    spin_ms(50);
    CHECK_RC(PAPI_stop(es, v), PAPI_OK);
    CHECK(calls == before);
    return finish("overflow");
}
