/* Runs f() `rounds` times, 5 ms apart, then prints the total: a target to attach to. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "papirus_target.h"

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
