/* Entries the patcher must handle without changing what they compute:
 * functions that take their own address RIP-relatively, and functions of
 * 2, 3 and 4 bytes followed by their alignment padding. Written in assembly
 * so the bytes are exactly these whatever the compiler. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

__asm__(
    ".text\n"
    /* lea -7(%rip),%rax; ret: returns its own address */
    ".globl self_addr\n.type self_addr,@function\n.p2align 4\n"
    "self_addr:\n  lea -7(%rip),%rax\n  ret\n.size self_addr,.-self_addr\n"
    /* returns 1 when its argument is its own address (CPython's subtype_traverse test) */
    ".globl is_self\n.type is_self,@function\n.p2align 4\n"
    "is_self:\n  lea is_self(%rip),%rax\n  cmp %rax,%rdi\n  sete %al\n  movzbl %al,%eax\n  ret\n"
    ".size is_self,.-is_self\n"
    /* jne +1; ret; lea -10(%rip),%rax; ret: its own address after a branch inside the first 5 bytes */
    ".globl self_after_branch\n.type self_after_branch,@function\n.p2align 4\n"
    "self_after_branch:\n  test %edi,%edi\n  jne 1f\n  xor %eax,%eax\n  ret\n"
    "1:\n  lea self_after_branch(%rip),%rax\n  ret\n.size self_after_branch,.-self_after_branch\n"
    /* 2 bytes: repz ret (returns rax unchanged: callers ignore it) */
    ".globl short2\n.type short2,@function\n.p2align 4\n"
    "short2:\n  repz ret\n.size short2,.-short2\n"
    /* 3 bytes: mov %edi,%eax; ret */
    ".globl short3\n.type short3,@function\n.p2align 4\n"
    "short3:\n  mov %edi,%eax\n  ret\n.size short3,.-short3\n"
    /* 4 bytes: lea 1(%rdi),%eax; ret */
    ".globl short4\n.type short4,@function\n.p2align 4\n"
    "short4:\n  lea 1(%rdi),%eax\n  ret\n.size short4,.-short4\n"
    /* push %rbx; mov %edi,%ebx; then +3, which enters_other jumps to: returns x + 1 */
    ".globl entered_at_3\n.type entered_at_3,@function\n.p2align 4\n"
    "entered_at_3:\n  push %rbx\n  mov %edi,%ebx\n2:\n  lea 1(%rbx),%eax\n  pop %rbx\n  ret\n"
    ".size entered_at_3,.-entered_at_3\n"
    ".globl enters_other\n.type enters_other,@function\n.p2align 4\n"
    "enters_other:\n  push %rbx\n  mov %edi,%ebx\n  jmp 2b\n.size enters_other,.-enters_other\n"
    ".p2align 4\n");

void *self_addr(void);
int is_self(void *p);
void *self_after_branch(int go);
void short2(void);
int short3(int x);
int short4(int x);
int entered_at_3(int x);
int enters_other(int x);

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    long sum = 0;
    int self_ok = 1;
    for (int i = 0; i < n; i++) {
        short2();
        sum += short3(i) + short4(i) + entered_at_3(i) + enters_other(i);
        self_ok &= self_addr() == (void *)self_addr;
        self_ok &= is_self((void *)is_self) && !is_self((void *)self_addr);
        self_ok &= self_after_branch(1) == (void *)self_after_branch && self_after_branch(0) == NULL;
    }
    printf("sum %ld self %d\n", sum, self_ok);
    return self_ok ? 0 : 1;
}
