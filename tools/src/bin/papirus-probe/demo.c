/* A small program for papirus-probe: nested calls, recursion, several
 * return paths, a tail call, many arguments, threads and a longjmp.
 * gcc -O2 -pthread -o probe_program probe_program.c */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

volatile long sink;

__attribute__((noinline)) long g(long x) {
    long s = 0;
    for (int i = 0; i < 100; i++) {
        s += i ^ x;
        __asm__ volatile("" : "+r"(s));
    }
    return s;
}

__attribute__((noinline)) long f(void) {
    long s = 0;
    for (int i = 0; i < 1000; i++) s += g(i);
    return s;
}

__attribute__((noinline, optimize("no-optimize-sibling-calls"))) int fib(int n) {
    if (n < 2) return n;
    int a = fib(n - 1);
    __asm__ volatile("" : "+r"(a));
    return a + fib(n - 2);
}

__attribute__((noinline)) int three(int x) {
    if (x < 0) return -1;
    if (x == 0) return (int)sink;
    return x * 2 + (int)sink;
}

__attribute__((noinline)) int tail_callee(int x) { return x * 3 + (int)sink; }
__attribute__((noinline)) int tail_caller(int x) { return tail_callee(x + 1); }

struct big { long a, b; double d; };

__attribute__((noinline)) struct big many(long i0, long i1, long i2, long i3, long i4, long i5,
                                          double d0, double d1, double d2, double d3,
                                          double d4, double d5, double d6, double d7,
                                          long s0, double s1) {
    struct big r = { i0 + 2 * i1 + 3 * i2 + 4 * i3 + 5 * i4 + 6 * i5 + s0,
                     i5 - i0,
                     d0 + 2 * d1 + 3 * d2 + 4 * d3 + 5 * d4 + 6 * d5 + 7 * d6 + 8 * d7 + s1 };
    return r;
}

/* Touches `n` fresh pages (page faults for the counters probe). */
__attribute__((noinline)) long touch_pages(int n) {
    char *p = malloc((size_t)n * 4096);
    long s = 0;
    for (int i = 0; i < n; i++) p[(size_t)i * 4096] = (char)i;
    for (int i = 0; i < n; i++) s += p[(size_t)i * 4096];
    free(p);
    return s;
}

static jmp_buf jb;
__attribute__((noinline)) void lj3(int n) { if (n > 0) longjmp(jb, n); sink++; }
__attribute__((noinline)) void lj2(int n) { lj3(n); sink++; }
__attribute__((noinline)) void lj1(int n) { lj2(n); sink++; }

static void *worker(void *arg) {
    *(long *)arg = f();
    return 0;
}

int main(void) {
    pthread_t t[4];
    long r[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, worker, &r[i]);
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    printf("threads: %ld %ld %ld %ld\n", r[0], r[1], r[2], r[3]);
    printf("f=%ld fib(20)=%d\n", f(), fib(20));
    printf("three: %d %d %d tail: %d\n", three(-3), three(0), three(5), tail_caller(41));
    struct big b = many(1, 2, 3, 4, 5, 6, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 77, 9.0);
    printf("many: %ld %ld %.2f\n", b.a, b.b, b.d);
    int v = setjmp(jb);
    if (v == 0) lj1(5);
    printf("longjmp: %d\n", v);
    printf("after: %d\n", three(7));
    printf("pages: %ld\n", touch_pages(512));
    return 0;
}
