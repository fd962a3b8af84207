/* Target of papirus' results tests: calls `leaf` a known number of times,
 * then ends the way argv[1] says, forks, or creates many short threads. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long counter;

__attribute__((noinline)) long leaf(long x) {
    counter++;
    return x * 3 + counter;
}

__attribute__((noinline)) long calls(int n) {
    long s = 0;
    for (int i = 0; i < n; i++) s += leaf(i);
    return s;
}

__attribute__((noinline)) long rec(int n) {
    counter++;
    if (!n) return 0;
    long r = rec(n - 1);
    __asm__ volatile("" : "+r"(r)); /* real recursion, not a loop */
    return r + 1;
}

/* Forks from inside an instrumented function: the child returns through
 * the frame the runtime hijacked in the parent. */
__attribute__((noinline)) pid_t spawn_child(void) {
    pid_t k = fork();
    __asm__ volatile("" ::: "memory");
    return k;
}

/* Set in a fork child by a handler registered before the probe runtime's
 * (`forkloop SECS hold`), so it runs first. */
static volatile int in_fork_child;
static void child_first(void) { in_fork_child = 1; }
static int (*real_setspecific)(pthread_key_t, const void *);

/* Built with -rdynamic, this interposes libc's for the runtime: in a fork
 * child, the runtime's fork handler calls it after it published the
 * child's record, and it stays here, outside the runtime, for up to 50
 * rounds of 1 ms while its caller's code is mapped. A tool that took the
 * child's PC for the whole story would unload the runtime under the
 * handler, and the child would die returning into it. */
int pthread_setspecific(pthread_key_t key, const void *value) {
    if (in_fork_child) {
        void *caller = (void *)((unsigned long)__builtin_return_address(0) & ~4095ul);
        for (int i = 0; i < 50 && msync(caller, 4096, MS_ASYNC) == 0; i++) usleep(1000);
    }
    return real_setspecific(key, value);
}

static volatile sig_atomic_t release_held;
static void on_usr1(int sig) {
    (void)sig;
    release_held = 1;
}

static long rss_kb(void) {
    char line[256];
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
    fclose(f);
    return kb;
}

static void *worker(void *arg) {
    (void)arg;
    calls(10);
    return NULL;
}

static void *exiter(void *arg) {
    (void)arg;
    calls(10);
    pthread_exit(NULL);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "exit0";
    real_setspecific = (int (*)(pthread_key_t, const void *))dlsym(RTLD_NEXT, "pthread_setspecific");
    calls(1000);
    printf("ready %d\n", getpid());
    fflush(stdout);
    if (!strcmp(mode, "exit5")) exit(5);
    if (!strcmp(mode, "_exit4")) _exit(4);
    if (!strcmp(mode, "abort")) abort();
    if (!strcmp(mode, "segv")) raise(SIGSEGV);
    if (!strcmp(mode, "pause")) for (;;) pause();
    if (!strcmp(mode, "exec")) {
        execl("/bin/true", "true", (char *)0);
        return 99;
    }
    if (!strcmp(mode, "fork")) {
        pid_t kids[3];
        for (int i = 0; i < 3; i++) {
            kids[i] = spawn_child();
            if (kids[i] == 0) {
                calls(1000);
                exit(0);
            }
        }
        for (int i = 0; i < 3; i++) waitpid(kids[i], NULL, 0);
        return 0;
    }
    if (!strcmp(mode, "threads")) {
        int n = argc > 2 ? atoi(argv[2]) : 2000;
        long before = rss_kb();
        for (int i = 0; i < n; i += 8) {
            pthread_t t[8];
            for (int j = 0; j < 8; j++)
                pthread_create(&t[j], NULL, (i + j) % 2 ? exiter : worker, NULL);
            for (int j = 0; j < 8; j++) pthread_join(t[j], NULL);
        }
        printf("rss %ld %ld\n", before, rss_kb());
        return 0;
    }
    if (!strcmp(mode, "deep")) return rec(5000) == 5000 ? 0 : 1;
    if (!strcmp(mode, "forkloop")) {
        /* Forks short-lived children for argv[2] seconds; each checks its own sums. */
        int secs = argc > 2 ? atoi(argv[2]) : 4, ok = 0, bad = 0;
        if (argc > 3 && !strcmp(argv[3], "hold")) pthread_atfork(0, 0, child_first);
        long want = calls(100) - calls(100);
        for (int round = 0; round < secs * 20; round++) {
            pid_t k = fork();
            if (k == 0) {
                in_fork_child = 0;
                for (int i = 0; i < 20; i++) {
                    long a = calls(100), b = calls(100);
                    if (a - b != want) _exit(3);
                    usleep(5000);
                }
                _exit(0);
            }
            calls(100);
            usleep(50000);
            int st;
            while ((k = waitpid(-1, &st, WNOHANG)) > 0) (WIFEXITED(st) && !WEXITSTATUS(st)) ? ok++ : bad++;
        }
        int st;
        while (wait(&st) > 0) (WIFEXITED(st) && !WEXITSTATUS(st)) ? ok++ : bad++;
        printf("children ok %d bad %d\n", ok, bad);
        return 0;
    }
    if (!strcmp(mode, "churn")) {
        /* Short threads forever, 8 at a time, ~400 a second. */
        for (;;) {
            pthread_t t[8];
            for (int j = 0; j < 8; j++) pthread_create(&t[j], NULL, j % 2 ? exiter : worker, NULL);
            for (int j = 0; j < 8; j++) pthread_join(t[j], NULL);
            usleep(20000);
        }
    }
    if (!strcmp(mode, "hold")) {
        /* Keeps the address of leaf's trampoline (read from the jump at its
         * entry while it is patched) in a stack word until SIGUSR1. */
        setvbuf(stdout, NULL, _IOLBF, 0);
        signal(SIGUSR1, on_usr1);
        volatile unsigned long held = 0;
        int once = 0;
        for (;;) {
            calls(100);
            const unsigned char *at = (const unsigned char *)leaf;
            if (!once && at[0] == 0xe9) {
                int rel;
                memcpy(&rel, at + 1, 4);
                held = (unsigned long)at + 5 + rel;
                once = 1;
                printf("held %lx\n", held);
            }
            if (release_held && held) {
                held = 0;
                printf("cleared\n");
            }
            usleep(1000);
        }
    }
    if (!strcmp(mode, "loop")) {
        for (;;) {
            calls(100);
            usleep(1000);
        }
    }
    return 0;
}
