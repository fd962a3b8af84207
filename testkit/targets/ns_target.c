/* Loads the library named by argv[1], maps 4 KiB of each further argument
 * executable at a low fixed address, prints the address of variant_fn, the
 * variant loaded and "ready", then calls variant_fn and checks every result
 * against that variant, until killed. Exits 1 on a wrong result. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    int (*fn)(int) = (int (*)(int))dlsym(h, "variant_fn");
    int (*id)(void) = (int (*)(void))dlsym(h, "variant_id");
    if (!fn || !id) return 2;
    unsigned long at = 0x20000000;
    for (int i = 2; i < argc; i++, at += 0x100000) {
        int fd = open(argv[i], O_RDONLY);
        if (fd < 0 || mmap((void *)at, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED_NOREPLACE, fd, 0) == MAP_FAILED) {
            perror(argv[i]);
            return 3;
        }
        close(fd);
    }
    int v = id();
    printf("%p %d\nready\n", (void *)fn, v);
    fflush(stdout);
    for (unsigned i = 0;; i++) {
        int x = (int)(i & 1023);
        if (fn(x) != v * 1000 + x) {
            printf("wrong result\n");
            fflush(stdout);
            return 1;
        }
        usleep(200);
    }
}
