/* Calls glibc's IFUNCs strlen and memcpy through their PLT slots (built
 * with -fno-builtin so the compiler keeps the calls). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    char src[64], dst[64];
    size_t total = 0;
    memset(src, 'a', 40);
    src[40] = 0;
    for (int i = 0; i < n; i++) {
        src[i % 40] = 'b';
        total += strlen(src);
        memcpy(dst, src, 41);
        total += (size_t)dst[i % 40];
    }
    printf("%zu\n", total);
    return 0;
}
