/* What a profiler must follow after it starts: a thread created later
   (named "late", running hot_b), a forked child process (running hot_c),
   and a library loaded with dlopen (its lib_spin, run by the main thread).

   profile_multi LIBRARY [ROUNDS]: exits 0 once all three are done. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "papirus_target.h"

static long rounds = 200;

void hot_b(void) { spin(1); }
void hot_c(void) { spin(1); }

static void *late(void *arg) {
    (void)arg;
    for (long r = 0; r < rounds; r++) hot_b();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (argc > 2) rounds = atol(argv[2]);
    spin(5); /* the profiler is running before any of what follows */
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 4; }
    void (*lib_spin)(void) = (void (*)(void))dlsym(lib, "lib_spin");
    pthread_t t;
    pthread_create(&t, NULL, late, NULL);
    pthread_setname_np(t, "late");
    pid_t child = fork();
    if (child == 0) {
        for (long r = 0; r < rounds; r++) hot_c();
        _exit(0);
    }
    for (long r = 0; r < rounds; r++) lib_spin();
    pthread_join(t, NULL);
    int status;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 5;
}
