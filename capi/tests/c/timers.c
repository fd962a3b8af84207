/* Timers: real time advances with the wall clock, virtual time with this
   thread's CPU time and not while it sleeps. */
#include <unistd.h>
#include "check.h"

static long long thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(void) {
    init_or_die();
    long long r0 = PAPI_get_real_nsec(), u0 = PAPI_get_real_usec(), c0 = PAPI_get_real_cyc();
    long long v0 = PAPI_get_virt_nsec(), vu0 = PAPI_get_virt_usec(), k0 = thread_cpu_ns();
    spin_ms(100);
    long long v1 = PAPI_get_virt_nsec(), k1 = thread_cpu_ns();
    usleep(100000);
    long long v2 = PAPI_get_virt_nsec();
    long long r1 = PAPI_get_real_nsec(), u1 = PAPI_get_real_usec(), c1 = PAPI_get_real_cyc();
    CHECK(r1 - r0 >= 200000000LL && r1 - r0 < 2000000000LL);
    CHECK(u1 - u0 >= 200000 && u1 - u0 < 2000000);
    CHECK(c1 > c0);
    double ratio = (double)(v1 - v0) / (double)(k1 - k0);
    KV("virt_vs_thread_cputime", "%s", ratio > 0.95 && ratio < 1.05 ? "within 5%" : "off");
    CHECK(ratio > 0.9 && ratio < 1.1);
    CHECK(v2 - v1 < 20000000LL);                                 /* asleep: no CPU time */
    CHECK(PAPI_get_virt_usec() >= vu0 + 90000);
    CHECK(PAPI_get_virt_cyc() > 0);
    /* Monotonic, back to back. */
    long long prev = PAPI_get_real_nsec();
    for (int i = 0; i < 100000; i++) {
        long long now = PAPI_get_real_nsec();
        if (now < prev) { failures++; break; }
        prev = now;
    }
    return finish("timers");
}
