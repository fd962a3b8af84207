/* A thread that nearly always holds the loader's write lock
 * (dl_iterate_phdr keeps it across its callbacks), which dlopen also
 * takes; the main thread echoes stdin until EOF. */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>

#include "papirus_target.h"

static int slow(struct dl_phdr_info *i, size_t n, void *d) {
    (void)i;
    (void)n;
    (void)d;
    usleep(2000);
    return 1;
}

static void *locker(void *a) {
    for (;;) dl_iterate_phdr(slow, 0);
    return a;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, 0, locker, 0);
    return echo_stdin();
}
