/* A target whose memory map names files papirus must not read blindly:
 * each argument is opened and 4 KiB of it mapped executable at a low fixed
 * address (so it comes first in /proc/PID/maps): /dev/zero, a sparse file
 * of GiBs, or a path that is another file (a FIFO) in the tool's view.
 * Then prints "ready" and calls work() until killed. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

__attribute__((noinline)) long work(long x) { return x * 2 + 1; }

int main(int argc, char **argv) {
    unsigned long at = 0x20000000;
    for (int i = 1; i < argc; i++, at += 0x100000) {
        int fd = open(argv[i], O_RDONLY);
        if (fd < 0) {
            perror(argv[i]);
            return 2;
        }
        void *p = mmap((void *)at, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED_NOREPLACE, fd, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 3;
        }
        close(fd);
    }
    printf("ready\n");
    fflush(stdout);
    volatile long sum = 0;
    for (;;) {
        long expect = (sum & 7) * 2 + 1;
        if (work(sum & 7) != expect) {
            printf("wrong result\n");
            fflush(stdout);
            return 1;
        }
        sum += expect;
        usleep(500);
    }
}
