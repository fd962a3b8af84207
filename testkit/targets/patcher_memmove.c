/* Calls glibc's IFUNCs memcpy, memmove and mempcpy through their PLT slots
 * (built with -fno-builtin), over lengths that take each size class of the
 * implementations, overlapping moves included, and prints a checksum of
 * every result. glibc's mempcpy enters memmove's implementation 3 bytes
 * past its start. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* With "until-stdin" instead of a count: runs until its standard input
 * ends, then prints the count of rounds it ran, then the checksum, which a
 * run with that count prints too. */
#include <poll.h>

static int input_ended(void) {
    struct pollfd p = {0, POLLIN, 0};
    char c;
    return poll(&p, 1, 0) == 1 && read(0, &c, 1) <= 0;
}

int main(int argc, char **argv) {
    int until = argc > 1 && strcmp(argv[1], "until-stdin") == 0;
    int n = argc > 1 && !until ? atoi(argv[1]) : 1000;
    static unsigned char buf[1024], out[1024];
    unsigned long sum = 0;
    for (int i = 0; i < (int)sizeof buf; i++)
        buf[i] = (unsigned char)(i * 7 + 1);
    if (until)
        fprintf(stderr, "ready\n");
    for (int i = 0; until || i < n; i++) {
        if (until && i % 4096 == 0 && input_ended()) {
            printf("%d\n", i);
            n = i;
            break;
        }
        size_t len = 1 + (size_t)(i * 37) % 700;
        memcpy(out, buf + i % 32, len);
        sum = sum * 31 + out[len - 1] + out[len / 2];
        memmove(buf + 1 + i % 3, buf, len);
        sum = sum * 31 + buf[len] + buf[1];
        unsigned char *e = mempcpy(out + 5, buf + 2, len % 90);
        sum = sum * 31 + (unsigned long)(e - out) + out[5];
    }
    printf("%lu\n", sum);
    return 0;
}
