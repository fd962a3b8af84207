/* What papirus' C and C++ test targets share, written once: include it in
 * one translation unit of a program or library (it defines functions, so
 * their symbols are there to be probed). C gets the work loop, C++ the
 * exception chain, so a C and a C++ target loaded into one process do not
 * define the same names. Built with -O2 by the tests. */
#ifndef PAPIRUS_TARGET_H
#define PAPIRUS_TARGET_H

#define NOINLINE __attribute__((noinline))

#ifndef __cplusplus
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
