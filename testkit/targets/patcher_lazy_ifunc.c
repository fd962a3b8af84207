/* Calls glibc's IFUNCs strstr and strncat through lazily bound PLT slots
 * (built with -fno-builtin and -z lazy), so their GOT slots hold no
 * implementation yet when papirus-probe run selects them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    const char *hay = "the quick brown fox jumps over the lazy dog, again and again";
    const char *needles[] = {"fox", "lazy", "again", "cat", "o"};
    unsigned long sum = 0;
    char buf[128];
    for (int i = 0; i < n; i++) {
        const char *p = strstr(hay + i % 10, needles[i % 5]);
        sum = sum * 31 + (p ? (unsigned long)(p - hay) : 7);
        buf[0] = 0;
        strncat(buf, hay + i % 20, 1 + i % 30);
        sum = sum * 31 + strlen(buf) + (unsigned char)buf[i % 30 < (int)strlen(buf) ? i % 30 : 0];
    }
    printf("%lu\n", sum);
    return 0;
}
