/* Event sets and PAPI's state rules, counted on software events. */
#include "check.h"

int main(void) {
    init_or_die();
    int es = PAPI_NULL, bad = 5, st = 0;
    long long v[2] = {0, 0}, acc[2] = {0, 0};
    CHECK_RC(PAPI_create_eventset(&bad), PAPI_EINVAL);          /* *es must be PAPI_NULL */
    CHECK_RC(PAPI_create_eventset(&es), PAPI_OK);
    CHECK_RC(PAPI_start(es), PAPI_ENOCMP);                      /* unbound */
    CHECK_RC(PAPI_start(12345), PAPI_ENOEVST);
    CHECK_RC(PAPI_num_events(es), 0);
    CHECK_RC(PAPI_add_named_event(es, "perf::TASK-CLOCK"), PAPI_OK);
    CHECK_RC(PAPI_add_named_event(es, "perf::PAGE-FAULTS"), PAPI_OK);
    CHECK_RC(PAPI_add_named_event(es, "perf::PAGE-FAULTS"), PAPI_ECNFLCT); /* twice */
    CHECK(PAPI_add_named_event(es, "no-such-event-at-all") < 0);   /* PAPI 7.0 says ENOSUPP, papirus ENOEVNT */
    CHECK_RC(PAPI_add_event(es, 0x1234), PAPI_EINVAL);         /* neither preset nor native */
    CHECK_RC(PAPI_num_events(es), 2);
    int codes[4], n = 4;
    CHECK_RC(PAPI_list_events(es, codes, &n), PAPI_OK);
    CHECK(n == 2);
    char name[PAPI_MAX_STR_LEN];
    CHECK_RC(PAPI_event_code_to_name(codes[1], name), PAPI_OK);
    CHECK(strcmp(name, "perf::PAGE-FAULTS") == 0);
    CHECK_RC(PAPI_state(es, &st), PAPI_OK);
    CHECK(st == PAPI_STOPPED);
    CHECK_RC(PAPI_stop(es, v), PAPI_ENOTRUN);
    CHECK_RC(PAPI_start(es), PAPI_OK);
    CHECK_RC(PAPI_state(es, &st), PAPI_OK);
    CHECK(st == PAPI_RUNNING);
    CHECK_RC(PAPI_start(es), PAPI_EISRUN);
    CHECK_RC(PAPI_add_named_event(es, "perf::CONTEXT-SWITCHES"), PAPI_EISRUN);
    CHECK_RC(PAPI_cleanup_eventset(es), PAPI_EISRUN);
    CHECK_RC(PAPI_destroy_eventset(&es), PAPI_EISRUN);
    long long t0 = PAPI_get_virt_nsec();
    spin_ms(50);
    touch_pages(1000);
    long long t1 = PAPI_get_virt_nsec();
    CHECK_RC(PAPI_read(es, v), PAPI_OK);
    CHECK(v[1] >= 1000);
    CHECK(v[0] > 0);
    KV("taskclock_vs_virt_percent", "%.1f", 100.0 * v[0] / (double)(t1 - t0));
    CHECK_RC(PAPI_accum(es, acc), PAPI_OK);                     /* adds, then resets */
    CHECK(acc[1] == v[1] || acc[1] >= v[1]);
    touch_pages(500);
    CHECK_RC(PAPI_read(es, v), PAPI_OK);
    KV("pagefaults_after_accum", "%lld", v[1]);
    CHECK_RC(PAPI_reset(es), PAPI_OK);
    CHECK_RC(PAPI_read(es, v), PAPI_OK);
    CHECK(v[1] < 50);
    CHECK_RC(PAPI_write(es, v), PAPI_ENOSUPP);
    long long cyc = 0;
    CHECK_RC(PAPI_read_ts(es, v, &cyc), PAPI_OK);
    CHECK(cyc > 0);
    touch_pages(2000);
    CHECK_RC(PAPI_stop(es, v), PAPI_OK);
    CHECK(v[1] >= 2000);
    KV("pagefaults_2000_pages_after_reset", "%lld", v[1]);
    long long after[2];
    CHECK_RC(PAPI_read(es, after), PAPI_OK);                    /* a stopped set reads its stop values */
    CHECK(after[1] == v[1] && after[0] == v[0]);
    CHECK_RC(PAPI_remove_named_event(es, "perf::CONTEXT-SWITCHES"), PAPI_EINVAL);
    CHECK_RC(PAPI_remove_named_event(es, "perf::TASK-CLOCK"), PAPI_OK);
    CHECK_RC(PAPI_num_events(es), 1);
    CHECK_RC(PAPI_destroy_eventset(&es), PAPI_EINVAL);          /* not empty */
    CHECK_RC(PAPI_cleanup_eventset(es), PAPI_OK);
    CHECK_RC(PAPI_destroy_eventset(&es), PAPI_OK);
    CHECK(es == PAPI_NULL);
    /* add_events stops at the first failure and says how many went in. */
    int es2 = PAPI_NULL, c[3];
    PAPI_event_name_to_code("perf::TASK-CLOCK", &c[0]);
    PAPI_event_name_to_code("perf::PAGE-FAULTS", &c[1]);
    c[2] = 0x4000ffff;
    CHECK_RC(PAPI_create_eventset(&es2), PAPI_OK);
    CHECK_RC(PAPI_add_events(es2, c, 3), 2);
    /* Many sets created and destroyed: handles are reused, nothing leaks. */
    for (int i = 0; i < 200; i++) {
        int e = PAPI_NULL;
        CHECK_RC(PAPI_create_eventset(&e), PAPI_OK);
        CHECK_RC(PAPI_add_event(e, c[0]), PAPI_OK);
        CHECK_RC(PAPI_cleanup_eventset(e), PAPI_OK);
        CHECK_RC(PAPI_destroy_eventset(&e), PAPI_OK);
    }
    PAPI_shutdown();
    CHECK_RC(PAPI_create_eventset(&es2), PAPI_ENOINIT);
    return finish("eventsets");
}
