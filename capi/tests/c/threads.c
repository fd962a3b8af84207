/* Threads: pthreads and OpenMP threads each counting their own CPU time,
   thread ids, per-thread storage and PAPI's user locks. */
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <omp.h>
#include "check.h"

#define THREADS 4
static long long counted[THREADS];
static int shared_counter;

static unsigned long tid_fn(void) { return (unsigned long)syscall(SYS_gettid); }

static void *work(void *arg) {
    long i = (long)arg;
    int es = PAPI_NULL;
    long long v[1];
    CHECK_RC(PAPI_register_thread(), PAPI_OK);
    CHECK_RC(PAPI_set_thr_specific(PAPI_USR1_TLS, arg), PAPI_OK);
    CHECK_RC(PAPI_create_eventset(&es), PAPI_OK);
    CHECK_RC(PAPI_add_named_event(es, "perf::TASK-CLOCK"), PAPI_OK);
    CHECK_RC(PAPI_start(es), PAPI_OK);
    spin_ms(20 * (int)(i + 1));
    CHECK_RC(PAPI_stop(es, v), PAPI_OK);
    counted[i] = v[0];
    for (int k = 0; k < 1000; k++) {
        PAPI_lock(PAPI_USR1_LOCK);
        shared_counter++;
        PAPI_unlock(PAPI_USR1_LOCK);
    }
    void *mine = NULL;
    CHECK_RC(PAPI_get_thr_specific(PAPI_USR1_TLS, &mine), PAPI_OK);
    CHECK(mine == arg);
    CHECK(PAPI_thread_id() == tid_fn());
    return NULL;
}

int main(void) {
    init_or_die();
    CHECK_RC(PAPI_thread_init(tid_fn), PAPI_OK);
    CHECK(PAPI_is_initialized() & PAPI_THREAD_LEVEL_INITED);
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, work, (void *)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++) {
        double want = 20e6 * (i + 1), got = (double)counted[i];
        CHECK(got > 0.9 * want && got < 1.5 * want);
    }
    CHECK(shared_counter == THREADS * 1000);
    int n = 0;
    CHECK_RC(PAPI_list_threads(NULL, &n), PAPI_OK);
    CHECK(n >= 1);
    unsigned long ids[64];
    n = 64;
    CHECK_RC(PAPI_list_threads(ids, &n), PAPI_OK);
    printf("threads known: %d\n", n);
    /* OpenMP: each thread of the team counts its own share. */
    long long omp_counted[16] = {0};
    int team = 0;
#pragma omp parallel num_threads(3)
    {
        int es = PAPI_NULL, me = omp_get_thread_num();
        long long v[1];
        PAPI_register_thread();
        if (PAPI_create_eventset(&es) == PAPI_OK && PAPI_add_named_event(es, "perf::TASK-CLOCK") == PAPI_OK &&
            PAPI_start(es) == PAPI_OK) {
            spin_ms(30);
            if (PAPI_stop(es, v) == PAPI_OK) omp_counted[me] = v[0];
        }
#pragma omp atomic
        team++;
    }
    for (int i = 0; i < team; i++) CHECK(omp_counted[i] > 25000000LL && omp_counted[i] < 60000000LL);
    KV("threads_counted_own_cpu_time", "%d", failures == 0);
    return finish("threads");
}
