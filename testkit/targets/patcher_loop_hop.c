/* A function whose own loop goes back to +2, just after its 2-byte first
 * instruction, and too long (over 96 bytes) to move whole: its entry takes
 * a 2-byte hop into the alignment padding after its `ret`. */
#include <stdio.h>
#include <stdlib.h>

__asm__(".text\n"
        ".globl loops_to_2\n.type loops_to_2,@function\n.p2align 4\n"
        "loops_to_2:\n  mov %edi,%eax\n"
        "2:\n  sub $3,%eax\n  .fill 90,1,0x90\n  cmp $0,%eax\n  jg 2b\n  ret\n"
        ".size loops_to_2,.-loops_to_2\n"
        ".p2align 4\n");

int loops_to_2(int x);

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    long sum = 0;
    for (int i = 0; i < n; i++)
        sum = sum * 3 + loops_to_2(i);
    printf("sum %ld\n", sum);
    return 0;
}
