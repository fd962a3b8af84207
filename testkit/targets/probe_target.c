/* Functions shaped like the probe acceptance cases; built by the tests with gcc -O2. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <unistd.h>

#include "papirus_target.h"

volatile long sink;
/* Never written: keeps results opaque to the compiler but independent of `sink`,
   which other tests change concurrently. */
volatile int zero;

__attribute__((noinline, optimize("no-optimize-sibling-calls"))) int fib(int n) {
    if (n < 2) return n;
    int a = fib(n - 1);
    __asm__ volatile("" : "+r"(a));
    return a + fib(n - 2);
}

__attribute__((noinline)) int three(int x) {
    if (x < 0) return -1;
    if (x == 0) return zero;
    return x * 2 + zero;
}

__attribute__((noinline)) int tail_callee(int x) { return x * 3 + zero; }
__attribute__((noinline)) int tail_caller(int x) { return tail_callee(x + 1); }

/* A short leaf: exactly 5 bytes at -O2 (lea; ret). */
__attribute__((noinline)) int leaf5(int x) { return 3 * x + 1; }

struct big { long a, b, c; double d, e; };

__attribute__((noinline)) struct big many(long i0, long i1, long i2, long i3, long i4, long i5,
                                          double d0, double d1, double d2, double d3,
                                          double d4, double d5, double d6, double d7,
                                          long s0, double s1) {
    struct big r;
    r.a = i0 + 2 * i1 + 3 * i2 + 4 * i3 + 5 * i4 + 6 * i5;
    r.b = s0;
    r.c = i5 - i0;
    r.d = d0 + 2 * d1 + 3 * d2 + 4 * d3 + 5 * d4 + 6 * d5 + 7 * d6 + 8 * d7;
    r.e = s1 * 0.5;
    return r;
}

static jmp_buf jb;
__attribute__((noinline)) void lj3(int n) { if (n > 0) longjmp(jb, n); sink++; }
__attribute__((noinline)) void lj2(int n) { lj3(n); sink++; }
__attribute__((noinline)) void lj1(int n) { lj2(n); sink++; }
__attribute__((noinline)) int run_longjmp(int n) {
    int r = setjmp(jb);
    if (r == 0) {
        lj1(n);
        return 0;
    }
    return r;
}

static void *worker(void *arg) {
    long *out = arg;
    out[1] = gettid();
    out[0] = f();
    return 0;
}

/* Runs f() on `n` (<= 8) threads; stores each result and tid. */
int run_threads(int n, long *results, long *tids) {
    pthread_t t[8];
    long slots[8][2];
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], 0, worker, slots[i])) return -1;
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], 0);
        results[i] = slots[i][0];
        tids[i] = slots[i][1];
    }
    return 0;
}

__attribute__((noinline)) int sig_fn(int s) { sink += s; return s; }
static volatile int handled;
static void handler(int s) { handled += sig_fn(s); }

/* Raises SIGUSR1 from inside an instrumented function; the handler calls another. */
__attribute__((noinline)) int with_signal(void) {
    struct sigaction sa = {0};
    sa.sa_handler = handler;
    sigaction(SIGUSR1, &sa, 0);
    handled = 0;
    raise(SIGUSR1);
    return handled;
}
