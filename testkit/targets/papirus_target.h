/* What papirus' C and C++ test targets share, written once: include it in
 * one translation unit of a program or library (it defines functions, so
 * their symbols are there to be probed). C gets the work loop, C++ the
 * exception chain, so a C and a C++ target loaded into one process do not
 * define the same names. Built with -O2 by the tests. */
#ifndef PAPIRUS_TARGET_H
#define PAPIRUS_TARGET_H

#define NOINLINE __attribute__((noinline))

#ifndef __cplusplus
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Prints "ready", echoes stdin until EOF, then prints "bye": a target that
 * stays until the test closes its stdin. 2 when a read fails. */
__attribute__((unused)) static int echo_stdin(void) {
    char buf[256];
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        ssize_t n = read(0, buf, sizeof buf);
        if (n == 0) break;
        if (n < 0) {
            printf("read error: %s\n", strerror(errno));
            return 2;
        }
        fwrite(buf, 1, n, stdout);
        fflush(stdout);
    }
    printf("bye\n");
    return 0;
}

/* `units` × 100,000 multiply-adds, inlined into its caller, so that the
 * caller is the leaf of every sample taken meanwhile. */
static volatile unsigned long spin_sink;
static inline __attribute__((always_inline)) void spin(unsigned long units) {
    unsigned long x = spin_sink;
    for (unsigned long i = 0; i < units * 100000UL; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    spin_sink = x;
}

/* About 100 ns of work that cannot be folded away. */
NOINLINE long g(long x) {
    long s = 0;
    for (int i = 0; i < 100; i++) {
        s += i ^ x;
        __asm__ volatile("" : "+r"(s));
    }
    return s;
}

/* 1,000 calls of g. */
NOINLINE long f(void) {
    long s = 0;
    for (int i = 0; i < 1000; i++) s += g(i);
    return s;
}

#else
/* A C++ exception thrown through three frames, one with a destructor;
 * run_exc(n) catches it and returns n (0: nothing thrown). */
volatile long csink;
volatile long destroyed;

struct Guard {
    ~Guard() { destroyed++; }
};

NOINLINE void ex3(int n) {
    if (n > 0) throw n;
    csink++;
}
NOINLINE void ex2(int n) {
    Guard g;
    ex3(n);
    csink++;
}
NOINLINE void ex1(int n) {
    ex2(n);
    csink++;
}
NOINLINE int run_exc(int n) {
    try {
        ex1(n);
        return 0;
    } catch (int v) {
        return v;
    }
}
#endif

#endif
