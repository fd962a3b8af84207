/* A thread in a raw system call with known values in every register the
 * kernel keeps across one (rdi, rsi, rdx, r10, r8, r9, rbx, rbp, r12-r15,
 * the carry flag, xmm0-15), checked when the call returns: whatever runs in
 * the thread meanwhile must leave it exactly as it was.
 *
 * `guarded_syscall read`: blocks in read(2) on stdin, one byte a round,
 * printing "ok N" after each; EOF ends it. `guarded_syscall sleep`:
 * nanosleep(300 ms) rounds (restarted through the kernel's restart block
 * when interrupted), each checked to last its full length, until stdin
 * reaches EOF (read by a second thread). A changed register prints
 * "FAIL registers", an error "FAIL error N" (EINTR is -4). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* long guarded_syscall(long nr, long a0, long a1, long a2): the system
 * call's result, or -4242 when a register changed across it. */
__asm__(
    ".text\n"
    ".globl guarded_syscall\n"
    "guarded_syscall:\n"
    "push %rbx\n push %rbp\n push %r12\n push %r13\n push %r14\n push %r15\n"
    "mov %rdi, %rax\n mov %rsi, %rdi\n mov %rdx, %rsi\n mov %rcx, %rdx\n"
    "mov %rdi, saved_rdi(%rip)\n mov %rsi, saved_rsi(%rip)\n mov %rdx, saved_rdx(%rip)\n"
    "mov $0x10101010, %r10\n mov $0x08080808, %r8\n mov $0x09090909, %r9\n"
    "mov $0x0b0b0b0b, %rbx\n mov $0x0e0e0e0e, %rbp\n"
    "mov $0x0c0c0c0c, %r12\n mov $0x0d0d0d0d, %r13\n mov $0x14141414, %r14\n mov $0x15151515, %r15\n"
    ".irp n,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n"
    "mov $(0x5a5a0000+\\n), %ecx\n movq %rcx, %xmm\\n\n"
    ".endr\n"
    "stc\n"
    "syscall\n"
    "jnc 1f\n"
    "mov %rax, %r11\n"
    "cmp saved_rdi(%rip), %rdi\n jne 1f\n cmp saved_rsi(%rip), %rsi\n jne 1f\n cmp saved_rdx(%rip), %rdx\n jne 1f\n"
    "cmp $0x10101010, %r10\n jne 1f\n cmp $0x08080808, %r8\n jne 1f\n cmp $0x09090909, %r9\n jne 1f\n"
    "cmp $0x0b0b0b0b, %rbx\n jne 1f\n cmp $0x0e0e0e0e, %rbp\n jne 1f\n"
    "cmp $0x0c0c0c0c, %r12\n jne 1f\n cmp $0x0d0d0d0d, %r13\n jne 1f\n"
    "cmp $0x14141414, %r14\n jne 1f\n cmp $0x15151515, %r15\n jne 1f\n"
    ".irp n,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n"
    "movq %xmm\\n, %rcx\n cmp $(0x5a5a0000+\\n), %rcx\n jne 1f\n"
    ".endr\n"
    "mov %r11, %rax\n jmp 2f\n"
    "1: mov $-4242, %rax\n"
    "2: pop %r15\n pop %r14\n pop %r13\n pop %r12\n pop %rbp\n pop %rbx\n ret\n"
    ".data\n"
    "saved_rdi: .quad 0\n saved_rsi: .quad 0\n saved_rdx: .quad 0\n"
    ".text\n");
long guarded_syscall(long nr, long a0, long a1, long a2);

static volatile int stop;

static void *watch(void *a) {
    char c;
    while (read(0, &c, 1) > 0) {}
    stop = 1;
    return a;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int sleeping = argc > 1 && !strcmp(argv[1], "sleep");
    pthread_t w;
    if (sleeping) pthread_create(&w, 0, watch, 0);
    printf("ready\n");
    fflush(stdout);
    for (long n = 0; !stop; n++) {
        char c;
        double t0 = now();
        struct timespec d = {0, 300 * 1000 * 1000};
        long r = sleeping ? guarded_syscall(35, (long)&d, 0, 0) : guarded_syscall(0, 0, (long)&c, 1);
        if (r == -4242) {
            printf("FAIL registers\n");
            return 1;
        }
        if (r < 0) {
            printf("FAIL error %ld\n", r);
            return 1;
        }
        if (sleeping && now() - t0 < 0.3) {
            printf("FAIL short sleep\n");
            return 1;
        }
        if (!sleeping && r == 0) break;
        printf("ok %ld\n", n);
        fflush(stdout);
    }
    return 0;
}
