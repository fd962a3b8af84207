/* Runs f() `rounds` times, 5 ms apart, then prints the total: a target to attach to. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    long total = 0;
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < rounds; i++) {
        total += f();
        usleep(5000);
    }
    printf("total=%ld\n", total);
    return 0;
}
